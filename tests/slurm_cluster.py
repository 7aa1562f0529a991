"""A real Slurm cluster on localhost for tests and benchmarks: one slurmctld and N `slurmd -N nK`.

No munge, no cgroups, no slurmdbd (see shared/notes/slurm-on-one-host.md). Daemons run as root.

    with SlurmCluster(tmp_dir) as cluster:
        subprocess.run(["sbatch", "--wrap", "true"], env={**os.environ, **cluster.env})

By hand:  python tests/slurm_cluster.py start DIR;  export SLURM_CONF=DIR/slurm.conf;  ...
          python tests/slurm_cluster.py stop DIR
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

DAEMONS = ("slurmctld", "slurmd", "sbatch", "srun", "squeue", "sinfo", "scontrol", "scancel")
INSTALL_HINT = "apt-get install slurmctld slurmd slurm-client"


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin:/sbin")


def available() -> str | None:
    """None when the Slurm daemons and clients are installed and can run here, else why not."""
    missing = [d for d in DAEMONS if _which(d) is None]
    if missing:
        return f"Slurm daemons not installed ({', '.join(missing)} missing): {INSTALL_HINT}"
    if os.geteuid() != 0:
        return "the localhost Slurm cluster runs its daemons as root (SlurmUser=root); not root here"
    return None


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class SlurmCluster:
    def __init__(self, root: Path | str, nodes: int = 3, cpus_per_node: int = 2, memory_mb: int = 4000,
                 partition: str = "debug", extra_conf: dict[str, str] | None = None):
        self.root = Path(root).resolve()
        self.nodes = [f"n{i}" for i in range(1, nodes + 1)]
        self.cpus_per_node = cpus_per_node
        self.memory_mb = memory_mb
        self.partition = partition
        self.extra_conf = extra_conf or {}  # slurm.conf keys to add or override, e.g. {"KillWait": "1"}
        self.conf_path = self.root / "slurm.conf"
        self.pid_file = self.root / "pids"
        self.env = {"SLURM_CONF": str(self.conf_path)}
        self._procs: dict[int, subprocess.Popen] = {}  # daemons started by this object (reaped on stop)

    # -- lifecycle ------------------------------------------------------------------------------------
    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, timeout: float = 60) -> SlurmCluster:
        if reason := available():
            raise RuntimeError(reason)
        if self.pid_file.exists():
            self.stop()
        for sub in ("state", "spool", "log", "run"):
            shutil.rmtree(self.root / sub, ignore_errors=True)  # job ids restart at 1 on a fresh state folder
            (self.root / sub).mkdir(parents=True)
        (self.root / "jobcomp.txt").unlink(missing_ok=True)
        self.conf_path.write_text(self.config())
        (self.root / "plugstack.conf").write_text("")
        env = {**os.environ, **self.env}
        cmds = [[_which("slurmctld"), "-D", "-f", str(self.conf_path)]]
        cmds += [[_which("slurmd"), "-D", "-N", n, "-f", str(self.conf_path)] for n in self.nodes]
        try:
            for cmd in cmds:
                self._spawn(cmd, env)
            self._wait_idle(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, cmd: list[str], env: dict[str, str]) -> None:
        name = cmd[0].rsplit("/", 1)[-1] + ("-" + cmd[3] if "-N" in cmd else "")
        with open(self.root / "log" / f"{name}.stdout", "ab") as out:
            p = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
        self._procs[p.pid] = p
        self.pid_file.write_text("".join(f"{pid}\n" for pid in self._procs))

    # -- a node lost and back -------------------------------------------------------------------------
    def kill_node(self, node: str, sig: int = signal.SIGKILL) -> list[int]:
        """What a host that dies does to this cluster: node `node`'s slurmd, its slurmstepds and every job process
        on it get `sig` at once (SIGSTOP: a host that hangs). Returns the pids."""
        jobs = {int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit() and _environ(int(d.name)).get(
            "SLURMD_NODENAME") == node and f"SLURM_CONF={self.conf_path}".encode() in _raw_environ(int(d.name))}
        steps = {pp for p in jobs if _comm(pp := int(_stat(p)[1])) == "slurmstepd"}
        daemon = {p for p in self._procs if self._alive(p) and b"-N\0" + node.encode() + b"\0" in _cmdline(p)}
        victims = sorted(jobs | steps | daemon)
        for p in victims:
            _signal(p, sig)
        return victims

    def revive_node(self, node: str, timeout: float = 90, busy_ok: bool = False) -> None:
        """After kill_node: kill what is left of the node, mark it down (its jobs end), start its slurmd again and
        wait until it is idle and no job is left on it (`busy_ok`: until it is up, idle or running a job that
        waited for it, e.g. a retry that needs every node)."""
        for p in self.kill_node(node, signal.SIGKILL):
            self._procs.pop(p, None)
        self.run("scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=revived by a test", check=False)
        self._spawn([_which("slurmd"), "-D", "-N", node, "-f", str(self.conf_path)], {**os.environ, **self.env})
        deadline, calm = time.monotonic() + timeout, 0
        while time.monotonic() < deadline:
            state = self.run("sinfo", "-h", "-n", node, "-o", "%t", check=False).stdout.strip()
            busy = self.run("squeue", "-h", "-w", node, check=False).stdout.strip()
            up = busy_ok and state in ("idle", "mix", "alloc")  # "*": not responding yet
            calm = calm + 1 if (state == "idle" and not busy) or up else 0
            if calm >= 3:  # idle, and no job left on it, for a second (its re-registration can bring a job back)
                return
            if state.startswith("down") and time.monotonic() > deadline - timeout + 5:
                self.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
            time.sleep(0.5)
        raise TimeoutError(f"node {node} not idle after {timeout} s\n{self._logs()}")

    def _wait_idle(self, timeout: float) -> None:
        deadline, states = time.monotonic() + timeout, {}
        while time.monotonic() < deadline:
            for pid in self._procs:
                if not self._alive(pid):
                    raise RuntimeError(f"a Slurm daemon exited at start:\n{self._logs()}")
            p = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
            states = dict(line.split() for line in p.stdout.splitlines() if len(line.split()) == 2)
            if p.returncode == 0 and all(states.get(n) == "idle" for n in self.nodes):
                return
            time.sleep(0.1)
        raise TimeoutError(f"Slurm nodes not idle after {timeout}s: {states}\n{self._logs()}")

    def stop(self, timeout: float = 10) -> None:
        """Stop the daemons, then kill every job process they left; wait until all are gone.

        No scancel first: with jobs running, slurmctld then takes ~15 s to shut down. start() wipes the state.
        """
        pids = self._pids()
        for pid in pids:
            _signal(pid, signal.SIGTERM)
        self._wait_gone(pids, timeout)
        for _ in range(3):  # again, in case a job process forked while we looked
            if not (strays := self._stray_pids()):
                break
            for pid in strays:
                _signal(pid, signal.SIGKILL)
            self._wait_gone(strays, 5)
        self.pid_file.unlink(missing_ok=True)
        self._procs.clear()

    def _pids(self) -> list[int]:
        """Daemon pids from the pid file, only those still running with this cluster's slurm.conf."""
        pids = [int(x) for x in self.pid_file.read_text().split()] if self.pid_file.exists() else []
        conf = str(self.conf_path).encode()
        return [p for p in pids if self._alive(p) if p in self._procs or conf in _cmdline(p)]

    def _alive(self, pid: int) -> bool:
        if pid in self._procs:
            return self._procs[pid].poll() is None
        return Path(f"/proc/{pid}").exists() and _stat(pid)[0] not in ("Z", "X")

    def _wait_gone(self, pids: list[int], timeout: float) -> None:
        deadline, killed = time.monotonic() + timeout, False
        while any(self._alive(p) for p in pids):
            if time.monotonic() > deadline:
                if killed:
                    raise TimeoutError(f"processes {[p for p in pids if self._alive(p)]} survive SIGKILL")
                for p in pids:
                    _signal(p, signal.SIGKILL)
                deadline, killed = time.monotonic() + 5, True
            time.sleep(0.05)

    def _stray_pids(self) -> list[int]:
        """This cluster's slurmstepds, slurmscriptd and job processes (they can outlive the daemons)."""
        conf = f"SLURM_CONF={self.conf_path}".encode()
        found = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) == os.getpid():
                continue
            try:
                env = (d / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            in_job = any(v.startswith(b"SLURM_JOB_ID=") for v in env)
            if conf in env and (in_job or _comm(int(d.name)) in ("slurmstepd", "slurmscriptd")):
                found.append(int(d.name))
        return found

    # -- helpers --------------------------------------------------------------------------------------
    def run(self, *args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(args, env={**os.environ, **self.env}, capture_output=True, text=True,
                              check=check, timeout=timeout)

    def _logs(self) -> str:
        return "\n".join(f"== {f.name}\n{f.read_text(errors='replace')[-2000:]}"
                         for f in sorted((self.root / "log").glob("*")) if f.stat().st_size)

    def config(self) -> str:
        ctld_port, *node_ports = _free_ports(1 + len(self.nodes))
        r = self.root
        conf = dict(line.split("=", 1) for line in [
            f"ClusterName=stoker{ctld_port}",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/none",
            "CredType=cred/none",
            "AuthInfo=cred_expire=30",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=batch_sched_delay=0,sched_interval=1",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={r}/jobcomp.txt",
            "MinJobAge=600",
            "SlurmdTimeout=10",
            "InactiveLimit=0",
            "KillWait=5",
            "ReturnToService=2",
            "MailProg=/bin/true",
            f"PlugStackConfig={r}/plugstack.conf",
            f"StateSaveLocation={r}/state",
            f"SlurmctldPidFile={r}/run/slurmctld.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdSpoolDir={r}/spool/%n",
            f"SlurmdPidFile={r}/run/slurmd-%n.pid",
            f"SlurmdLogFile={r}/log/slurmd-%n.log",
        ])
        conf.update(self.extra_conf)
        lines = [f"{k}={v}" for k, v in conf.items()]
        lines += [f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} "
                  f"CPUs={self.cpus_per_node} RealMemory={self.memory_mb} State=UNKNOWN"
                  for n, port in zip(self.nodes, node_ports, strict=True)]
        lines.append(f"PartitionName={self.partition} Nodes={','.join(self.nodes)} Default=YES "
                     "MaxTime=INFINITE State=UP OverSubscribe=FORCE:4")
        return "\n".join(lines) + "\n"


def _stat(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return ["X", "0"]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _raw_environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def _environ(pid: int) -> dict[str, str]:
    return dict(v.split("=", 1) for v in _raw_environ(pid).decode(errors="replace").split("\0") if "=" in v)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        print("usage: python tests/slurm_cluster.py start|stop DIR", file=sys.stderr)
        return 2
    cluster = SlurmCluster(argv[1])
    if argv[0] == "start":
        cluster.start()
        print(f"Slurm cluster up ({', '.join(cluster.nodes)}); pids in {cluster.pid_file}\n"
              f"export SLURM_CONF={cluster.conf_path}")
    else:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
