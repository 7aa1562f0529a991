"""Warm ranks: how a node of a gang with spares (`@torchrun(spares=k)`) starts its ranks for each generation.

A new generation (a spare took a lost node's place) restarts training on every node: with torchrun that is a new
launcher and new workers, each a new Python importing torch and the entrypoint (seconds each, on every node at
once), and it is most of a recovery. Here each node keeps one process, started once (distributed/zygote.py), that has
imported torch and every module the entrypoint imports; each generation's ranks are forked from it in milliseconds.
A waiting spare starts its own as soon as node 0 has said what the entrypoint is, so it is as warm as the survivors.

The ranks get the environment torchrun gives its workers (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
GROUP_RANK, ROLE_*, MASTER_ADDR/PORT: a static rendezvous; rank 0 hosts the process group's store, no agent store),
their output is prefixed with their local rank as torchrun's `--tee=3` does (`[default0]:...`), and when one fails the
node's others get SIGTERM, then SIGKILL after the grace. A rank shows as `stoker-rank<RANK>` in `ps -o comm`.
`STOKER_WARM_RANKS=0` starts each rank as a new Python instead (same launcher, no fork), as does a zygote whose
imports left a thread running (forking it would not be safe).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from stoker.errors import EXIT_PREEMPTED, StokerError

OFF_ENV = "STOKER_WARM_RANKS"
MAX_INLINE = 64 * 1024  # a message to the launcher longer than this goes through a file
_STOP_CODES = {EXIT_PREEMPTED, -signal.SIGTERM}  # an expected end of a rank: preempted, or stopped after one was
_PER_LAUNCH = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
               "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT"}  # rank_env's
_PER_TASK = ("STOKER_", "TORCHELASTIC_", "MF_PARALLEL_")  # stoker's, torchrun's and Metaflow's own variables
_LAUNCHERS: list[WarmLauncher] = []  # this process's (one per node agent: a spare starts it while it waits)


def rank_env(node_rank: int, nnodes: int, nproc: int, local: int, addr: str, port: int) -> dict[str, str]:
    """What torchrun tells worker `local` of node `node_rank` (a static rendezvous on `addr:port`)."""
    rank, world = node_rank * nproc + local, nnodes * nproc
    return {"RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(nproc),
            "GROUP_RANK": str(node_rank), "GROUP_WORLD_SIZE": str(nnodes), "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(world), "ROLE_NAME": "default", "MASTER_ADDR": addr, "MASTER_PORT": str(port),
            "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "none",
            "TORCHELASTIC_USE_AGENT_STORE": "False"}


def env_changes(before: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """The variables set, changed or unset between two environments, less those of one launch or task (the rank's,
    torchrun's, stoker's own, Metaflow's `MF_PARALLEL_*`: no module reads them when it is imported)."""
    keys = {k for k in set(before) | set(now) if _unhooked(before, k) != _unhooked(now, k)}
    return sorted(k for k in keys if k not in _PER_LAUNCH and not k.startswith(_PER_TASK))


def _unhooked(env: Mapping[str, str], key: str) -> str | None:
    """A variable as an import sees it: PYTHONPATH without the stack hook's folder, which a task adds for its
    children (runtime/member/watchdog.py) and a forked rank installs itself (zygote.py)."""
    value = env.get(key)
    if key != "PYTHONPATH" or not value:
        return value
    from stoker.distributed.rankstacks import HOOK_DIR

    return os.pathsep.join(p for p in value.split(os.pathsep) if p != HOOK_DIR) or None


def zygote_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment a warm launcher starts in: the task's workers' (`OMP_NUM_THREADS=1` unless set, as torchrun
    sets it; a BLAS pool started at import would make forking unsafe)."""
    return {**env, "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS") or "1"}


def close_all() -> None:
    """Stop this process's warm launchers (a spare that was not needed)."""
    for w in list(_LAUNCHERS):
        w.close()


class WarmLaunchError(StokerError):
    """The warm launcher could not start the ranks (it died, timed out, or could not fork)."""


class WarmLauncher:
    """This node's zygote (started at once; its imports go on in the background) and the socket to it."""

    def __init__(self, env: Mapping[str, str], cwd: str | None = None) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.log = tempfile.TemporaryFile()  # its own stderr (not the task's log: it outlives nothing of it)
        self.proc = subprocess.Popen([sys.executable, "-m", "stoker.distributed.zygote", str(theirs.fileno()),
                                      str(os.getpid())], pass_fds=[theirs.fileno()], env=dict(env), cwd=cwd,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log)
        theirs.close()
        self.env, self.cwd = dict(env), cwd
        self.sock, self.pending, self.preloaded = mine, 0, {"loaded": [], "failed": {}, "s": 0.0, "threads": 1,
                                                            "unsafe": ""}
        self.entries: set[tuple[str | None, str | None]] = set()
        self.events: list[dict[str, Any]] = []  # rank exits read while waiting for something else

    @classmethod
    def get(cls, env: Mapping[str, str], cwd: str | None = None) -> WarmLauncher:
        """This process's launcher (a spare's was started while it waited), or a new one. One whose environment or
        folder differs from `env`, `cwd` (past the variables of one launch: the rank's, stoker's) is replaced, and
        the run says which variables: what it imported may have read them."""
        for w in list(_LAUNCHERS):
            if not w.alive():
                w.close()
                continue
            changed = env_changes(w.env, env) + (["the working folder"] if cwd and w.cwd and cwd != w.cwd else [])
            if not changed:
                return w
            print(f"stoker: the warm launcher is started again: {', '.join(changed[:8])}"
                  f"{' ...' if len(changed) > 8 else ''} changed since it imported the entrypoint's modules",
                  file=sys.stderr, flush=True)
            w.close()
        w = cls(env, cwd)
        _LAUNCHERS.append(w)
        return w

    def alive(self) -> bool:
        return self.proc.poll() is None

    def preload(self, module: str | None = None, script: str | None = None) -> None:
        """Have the zygote import torch and what the entrypoint (`-m module`, or a script's path) imports."""
        if (module, script) in self.entries:
            return
        self.entries.add((module, script))
        self._send({"op": "preload", "entry": {"module": module, "script": script}})
        self.pending += 1

    def ready(self, timeout: float = 600.0) -> dict[str, Any]:
        """Wait for the imports asked for; what was loaded, what failed, how long it took, and why a fork would not be
        safe ("unsafe": the ranks then start as new processes)."""
        deadline = time.monotonic() + timeout
        while self.pending:
            msg = self._recv(deadline - time.monotonic())
            if msg is None:
                raise WarmLaunchError(f"the warm launcher did not finish its imports in {timeout:.0f} s")
            if msg["op"] == "preloaded":
                self.pending -= 1
                self.preloaded = {**msg, "loaded": self.preloaded["loaded"] + msg["loaded"],
                                  "failed": {**self.preloaded["failed"], **msg["failed"]},
                                  "s": self.preloaded["s"] + msg["s"], "unsafe": msg["unsafe"] or
                                  self.preloaded["unsafe"]}
            else:
                self.events.append(msg)
        return self.preloaded

    def launch(self, *, module: str | None, script: str | None, args: Sequence[str], env: Mapping[str, str],
               ranks: list[dict[str, str]], cwd: str, tee: bool, grace: float) -> Ranks:
        """Fork this node's ranks (one per `ranks` entry: its own variables over `env`)."""
        self.preload(module, script)
        self.ready()
        env = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", **env}  # as torchrun: the user's value wins
        fresh = os.environ.get(OFF_ENV, env.get(OFF_ENV, "1")) == "0"
        pipes: list[tuple[int, int]] = [os.pipe() for _ in range(2 * len(ranks))] if tee else []
        try:
            for i in range(len(ranks)):  # each rank's stdout and stderr, one rank a message (a datagram holds 253)
                self._send({"op": "fds"}, [pipes[2 * i][1], pipes[2 * i + 1][1]] if tee else [1, 2])
            self.events.clear()
            self._send({"op": "launch", "env": dict(env), "ranks": ranks, "argv": list(args), "module": module,
                        "script": script, "cwd": cwd, "fresh": fresh})
        finally:
            for _, w in pipes:
                os.close(w)
        deadline = time.monotonic() + 60
        while (msg := self._recv(deadline - time.monotonic())) is None or msg["op"] not in ("launched", "error"):
            if msg is None:  # it never answered: whatever it forked goes with it
                self.close()
                raise WarmLaunchError("the warm launcher did not start the ranks in 60 s")
        if msg["op"] == "error":
            for r, _ in pipes:
                os.close(r)
            raise WarmLaunchError(f"the warm launcher could not start the ranks: {msg['error']}")
        return Ranks(self, msg["pids"], [int(r["RANK"]) for r in ranks], [r for r, _ in pipes], grace,
                     bool(msg["fresh"]))

    def signal(self, sig: int) -> None:
        try:
            self._send({"op": "signal", "sig": int(sig)})
        except OSError:  # the zygote is gone, and its ranks with it
            pass

    def close(self) -> None:
        self.sock.close()  # the zygote kills its ranks and leaves
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        if self in _LAUNCHERS:
            _LAUNCHERS.remove(self)

    def _send(self, doc: dict[str, Any], fds: Sequence[int] = ()) -> None:
        data = json.dumps(doc).encode()
        if len(data) > MAX_INLINE:  # one datagram holds ~200 KB: a larger environment goes by a file only we read
            fd, path = tempfile.mkstemp(prefix="stoker-launch-", suffix=".json")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            data = json.dumps({"op": doc["op"], "file": path}).encode()
        try:
            if fds:
                socket.send_fds(self.sock, [data], list(fds))
            else:
                self.sock.send(data)
        except OSError as e:
            raise WarmLaunchError(f"the warm launcher is gone ({e}){self._said()}") from None

    def _recv(self, timeout: float) -> dict[str, Any] | None:
        """The zygote's next message within `timeout` seconds, else None; its end raises WarmLaunchError."""
        self.sock.settimeout(max(0.001, timeout))
        try:
            data = self.sock.recv(1 << 20)
        except (TimeoutError, BlockingIOError):
            return None
        except OSError as e:
            raise WarmLaunchError(f"the warm launcher is gone ({e}){self._said()}") from None
        finally:
            if self.sock.fileno() >= 0:
                self.sock.settimeout(None)
        if not data:
            raise WarmLaunchError(f"the warm launcher ended (exit code {self.proc.poll()}){self._said()}")
        return json.loads(data)

    def _said(self) -> str:
        """The end of what the zygote wrote on its stderr (why it died), as `: ...`, or ""."""
        try:
            self.log.seek(0)
            tail = self.log.read().decode(errors="replace").strip().splitlines()[-3:]
        except (OSError, ValueError):
            return ""
        return f": {' | '.join(tail)}" if tail else ""


class Ranks:
    """One launch's ranks on this node, as torchrun's process is to `_spawn`: wait for them, stop them, and say how
    they ended (`finish`, `codes`). A rank that ends non-zero before stoker stopped any is a failure of its own (its
    code is in `codes`, what the gang acts on); the ranks stoker then stopped (SIGTERM, SIGKILL after the grace) are
    reported as stopped, as torchrun does not report the workers it stops."""

    def __init__(self, launcher: WarmLauncher, pids: list[int], ranks: list[int], outs: list[int], grace: float,
                 fresh: bool) -> None:
        self.launcher, self.pids, self.ranks, self.grace, self.fresh = launcher, pids, ranks, grace, fresh
        self.exits: dict[int, int] = {}  # local rank -> exit code (-N: killed by signal N)
        self.own: dict[int, int] = {}  # local rank -> exit code, of the ranks that failed before any was stopped
        self.stopping_at: float | None = None
        self.killed = self.lost = False
        self.codes: set[int] = set()
        # prefixed with the local rank, as torchrun's (`[default<local_rank>]:`): the ranks come in local order
        self.pumps = [threading.Thread(target=_pump, args=(fd, i // 2, 1 + i % 2), daemon=True,
                                       name=f"rank-{ranks[i // 2]}-out") for i, fd in enumerate(outs)]
        for t in self.pumps:
            t.start()

    def wait(self, timeout: float | None = None) -> int:
        """The launch's exit code once every rank ended (0 when all did well, else 1, as torchrun's); raises
        subprocess.TimeoutExpired after `timeout` seconds. A rank that fails stops the others (SIGTERM, then
        SIGKILL after the grace)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(self.exits) < len(self.pids):
            for msg in self.launcher.events:
                self._note(msg)
            self.launcher.events.clear()
            if len(self.exits) == len(self.pids):
                break
            if self.stopping_at is not None and not self.killed and time.monotonic() > self.stopping_at + self.grace:
                self.kill()
            left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
            if deadline is not None and left <= 0:
                raise subprocess.TimeoutExpired("ranks", timeout or 0)
            try:
                msg = self.launcher._recv(left)
            except WarmLaunchError as e:  # the zygote died: its ranks died with it (SIGKILL), none of their own
                print(f"stoker: {e}", file=sys.stderr, flush=True)
                self.lost = True
                self.exits.update({i: self.exits.get(i, -signal.SIGKILL) for i in range(len(self.pids))})
                break
            if msg is not None:
                self._note(msg)
        end = time.monotonic() + 5  # their output, to its last line (a grandchild that holds a pipe is not waited for)
        for t in self.pumps:
            t.join(timeout=max(0.0, end - time.monotonic()))
        return 0 if all(c == 0 for c in self.exits.values()) else 1

    def _note(self, msg: dict[str, Any]) -> None:
        if msg.get("op") != "exit" or msg.get("pid") not in self.pids:
            return
        self.exits[int(msg["rank"])] = code = int(msg["code"])
        if code != 0 and self.stopping_at is None and not self.killed:
            self.own[int(msg["rank"])] = code  # a failure of its own, before stoker stopped any
            if len(self.exits) < len(self.pids):
                self.terminate()  # as torchrun: one rank failed, the node's others stop

    def terminate(self) -> None:
        if self.stopping_at is None:
            self.stopping_at = time.monotonic()
        self.launcher.signal(signal.SIGTERM)

    def term_workers(self) -> None:
        """SIGTERM to every rank (a preemption: they checkpoint and stop); what they exit with is not a failure of
        their own."""
        self.terminate()

    def kill(self) -> None:
        self.killed = True
        self.launcher.signal(signal.SIGKILL)

    def finish(self, preempted: bool, node: int | str = 0, succeeded: bool = False) -> None:
        """Say how the ranks ended (torchrun's report, one line per rank that failed of its own, one line for those
        stoker stopped); an expected stop (`preempted`: every rank that reported said 75) in one line."""
        failed = {self.ranks[i]: c for i, c in sorted(self.exits.items()) if c != 0}
        if not failed:
            return
        if preempted and not set(failed.values()) - _STOP_CODES:
            print(f"torchrun: node {node}: every worker stopped after a preemption (exit code {EXIT_PREEMPTED}, "
                  "checkpoint committed)", file=sys.stderr, flush=True)
            return
        own = {self.ranks[i]: c for i, c in sorted(self.own.items())}
        self.codes = set(own.values())
        for rank, code in own.items():
            how = f"killed by signal {-code} ({_signame(-code)})" if code < 0 else f"exit code {code}"
            print(f"torchrun: node {node}: rank {rank} failed (exitcode: {code}): {how}", file=sys.stderr,
                  flush=True)
        if stopped := sorted(set(failed) - set(own)):
            why = "its warm launcher died" if self.lost else "stopped by stoker"
            print(f"torchrun: node {node}: rank{'s' if len(stopped) > 1 else ''} {', '.join(map(str, stopped))} "
                  f"{why}", file=sys.stderr, flush=True)


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


_OUT_LOCKS = {1: threading.Lock(), 2: threading.Lock()}  # ranks' lines never mix on this process's stdout, stderr


def _pump(fd: int, rank: int, out: int) -> None:
    """Copy a rank's stdout or stderr to this process's, each line prefixed `[default<local rank>]:` (torchrun's
    tee)."""
    prefix, rest = f"[default{rank}]:".encode(), b""
    with os.fdopen(fd, "rb", buffering=0) as f:
        while chunk := f.read(65536):
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            if lines:
                _write(out, b"".join(prefix + line + b"\n" for line in lines))
    if rest:
        _write(out, prefix + rest + b"\n")


def _write(fd: int, data: bytes) -> None:
    try:
        with _OUT_LOCKS[fd]:
            while data:
                data = data[os.write(fd, data):]
    except OSError:  # the log went away: the rank must not block on a full pipe
        pass
