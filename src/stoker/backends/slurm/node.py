"""What every node of a Slurm job runs: `python -m stoker.backends.slurm.node --store URL --code KEY --spec KEY`
(the sbatch script's srun line): the member side's node agent (runtime/member/node.py), told how to read
Slurm's variables: `SLURM_ARRAY_TASK_ID` (an array element) or `SLURM_NODEID` (a gang node, one task per node),
`SLURM_JOB_NUM_NODES`, the first host of `SLURM_JOB_NODELIST`, a port derived from `SLURM_JOB_ID`, the node's
name in Slurm (`SLURMD_NODENAME`: what a lost node's heartbeat names) and, in a gang with spares, the node's own
address from the batch script's `STOKER_NODE_ADDRS` (`name=NodeAddr,...`; render.py).

Slurm without accounting tells no gang member's end apart from the job's: the job's exit code is srun's, one for
all nodes (when one node dies, `--kill-on-bad-exit` TERMinates the others), and in a gang with spares the job
outlives its members (a spare waits until the gang is over, a lost node leaves the others running). So in a gang
(`STOKER_SLURM_EXITS`, the unit's log folder) the agent runs in a child process and this one writes the child's exit
code to `<folder>/<job>-<member>.exit` when it ends: the backend reads it as that member's status (backend.py).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
from collections.abc import Callable, Mapping

from stoker._process import unsafe_to_fork
from stoker.backends.slurm.render import member_exit
from stoker.backends.slurm.states import expand_hostlist
from stoker.runtime.member.node import main
from stoker.runtime.member.nodeenv import NodeEngine, NodeIdentity

PORT_BASE, PORT_SPAN = 12000, 20000  # below Linux's ephemeral range (32768-60999)


def port_for_job(job_id: str) -> int:
    """A rendezvous port that differs between jobs (and so between retries of a gang)."""
    digits = re.sub(r"\D", "", str(job_id)) or "0"
    return PORT_BASE + (int(digits) * 7919) % PORT_SPAN


def node_addrs(value: str) -> dict[str, str]:
    """`n1=10.0.0.1,n2=10.0.0.2` (the batch script's STOKER_NODE_ADDRS) -> {name: address}; bad items are skipped."""
    out = {}
    for item in value.split(","):
        name, sep, addr = item.strip().partition("=")
        if sep and name and addr:
            out[name] = addr
    return out


def slurm_identity(env: Mapping[str, str]) -> NodeIdentity | None:
    if "SLURM_JOB_ID" not in env:
        return None
    member = int(env.get("SLURM_ARRAY_TASK_ID") or env.get("SLURM_NODEID") or 0)
    hosts = expand_hostlist(env.get("SLURM_JOB_NODELIST", "")) or [socket.gethostname()]
    name = env.get("SLURMD_NODENAME", "")
    return NodeIdentity(member, int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1), hosts[0],
                        port_for_job(env["SLURM_JOB_ID"]), name,
                        node_addrs(env.get("STOKER_NODE_ADDRS", "")).get(name, "") if name else "")


def supervised(run: Callable[[], object], path: str, argv: list[str] | None = None) -> int:
    """Run `run` in a child process; write its exit code (negative: the signal that killed it) to `path` when it
    ends and return the code to exit with. This process ignores TERM/INT/HUP: Slurm signals every process of the
    step, and the child (the node agent) handles them itself.

    The child is forked (this process has only imported the agent: one thread, no pool). Should an import have
    left something a fork does not survive (stoker._process.unsafe_to_fork: a second thread, CUDA, a device
    runtime), the child is `argv` started as a new process instead, with STOKER_SLURM_EXITS unset."""
    if argv is not None and (why := unsafe_to_fork(max_threads=1)):
        import subprocess

        print(f"stoker: {why} in the node's supervisor: the node agent starts as a new process", file=sys.stderr)
        proc = subprocess.Popen(argv, env={k: v for k, v in os.environ.items() if k != "STOKER_SLURM_EXITS"})
        pid = proc.pid
    else:
        pid = os.fork()
    if pid == 0:  # the node agent: it ends with os._exit
        code = 1
        try:
            run()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        finally:
            os._exit(code)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    try:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{code}\n")
        os.replace(tmp, path)
    except OSError:
        pass  # the job's own end still says it
    return code if code >= 0 else 128 - code


SLURM = NodeEngine("slurm", slurm_identity)

if __name__ == "__main__":
    folder, job = os.environ.get("STOKER_SLURM_EXITS"), os.environ.get("SLURM_JOB_ID")
    if folder and job and "SLURM_NODEID" in os.environ:
        member = int(os.environ["SLURM_NODEID"])
        os._exit(supervised(lambda: main(engine=SLURM), member_exit(folder, job, member),
                            [sys.executable, "-m", "stoker.backends.slurm.node", *sys.argv[1:]]))
    main(engine=SLURM)
