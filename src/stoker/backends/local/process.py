"""One local member process: forked (runs the task in-process) or spawned (`python flow.py _task SPEC`)."""

from __future__ import annotations

import gc
import io
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING

from stoker._process import close_parent_only_fds, die_with_parent, signal_tree
from stoker.runtime.member import handover
from stoker.runtime.spec import TaskSpec

if TYPE_CHECKING:
    from stoker.backends.local.forkserver import ForkServer

TAIL = 64 << 10
# After a fork every page of the scheduler is copy-on-write, so each page it then writes costs a page fault and a
# copy, and the garbage collector's full passes write to every object they visit. Frozen objects (all there are at
# the first fork: modules, the flow, the graph) are never visited again; the run's own (tasks) still are.
_frozen = False


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux >= 5.3
        return None


class Member:
    """A member process with its (stdout, stderr) pipes and a pidfd that is readable once it exits."""

    def __init__(self, pid: int, fds: tuple[int, int], popen: subprocess.Popen | None = None,
                 spec_file: str | None = None, server: ForkServer | None = None) -> None:
        self.pid, self.fds, self.popen, self.spec_file, self.server = pid, fds, popen, spec_file, server
        for fd in fds:
            os.set_blocking(fd, False)
        self.exit_fd = None if server is not None else _pidfd(pid)  # the server's report wakes the scheduler
        self.started = time.time()
        self.code: int | None = None
        self.reaped = False
        self.early = False  # reported done when it handed over a success, before it exited (LocalBackend._let_go)
        self.tail = {"stdout": bytearray(), "stderr": bytearray()}

    def keep(self, stream: str, data: bytes) -> None:
        buf = self.tail[stream]
        buf += data
        del buf[:-TAIL]

    def poll(self) -> int | None:
        if self.code is not None:
            return self.code
        if self.popen is not None:
            self.code = self.popen.poll()
        elif self.server is not None:
            self.code = self.server.exit_code(self.pid)
        else:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = self.pid, 1 << 8
            if pid:
                self.code = os.waitstatus_to_exitcode(status)
        if self.code is not None and self.spec_file and os.path.exists(self.spec_file):
            os.unlink(self.spec_file)
        return self.code

    def signal(self, sig: int, tree: bool = True) -> None:
        signal_tree(self.pid, sig, tree)


def fork_member(env: dict[str, str], entry: Callable[[], int]) -> Member:
    r_out, w_out = os.pipe()
    r_err, w_err = os.pipe()
    pid = fork_child(env, entry, (w_out, w_err), close=(r_out, r_err))
    os.close(w_out)
    os.close(w_err)
    return Member(pid, (r_out, r_err))


def server_members(server: ForkServer, starts: list[tuple[dict, dict[str, str]]]) -> list[Member]:
    """Members forked by the fork server (STOKER_TASK_LAUNCH=forkserver), each from (spec document, env), in one
    request: the pipes are made here, their write ends go to the server with the request."""
    pipes = [(os.pipe(), os.pipe()) for _ in starts]
    try:
        pids = server.start_many([(doc, env, (out[1], err[1])) for (doc, env), (out, err) in zip(starts, pipes,
                                                                                                 strict=True)])
    except BaseException:
        for out, err in pipes:
            os.close(out[0])
            os.close(err[0])
        raise
    finally:
        for out, err in pipes:
            os.close(out[1])
            os.close(err[1])
    return [Member(pid, (out[0], err[0]), server=server) for pid, (out, err) in zip(pids, pipes, strict=True)]


def fork_child(env: dict[str, str], entry: Callable[[], int], w_fds: tuple[int, int], close: tuple[int, ...] = (),
               environ: dict[str, str] | None = None) -> int:
    """Fork a member that runs ``entry`` with stdout/stderr on ``w_fds`` (the caller closes them); its pid.
    ``environ``: the whole environment to start from (a fork server's member gets the scheduler's)."""
    global _frozen
    if not _frozen:  # see _FREEZE
        gc.freeze()
        _frozen = True
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the member process
        code = 1
        try:
            os.setsid()
            close_parent_only_fds()
            handover.claim()  # this member hands its manifest over on the socket its backend offered
            die_with_parent()
            if os.getppid() != parent:  # the scheduler died before prctl took effect
                os._exit(1)
            for fd in close:
                os.close(fd)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(w_fds[0], 1)
            os.dup2(w_fds[1], 2)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            signal.set_wakeup_fd(-1)
            sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
            sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
            if environ is not None:
                os.environ.clear()
                os.environ.update(environ)
            os.environ.update(env)
            code = entry()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:  # noqa: BLE001
            traceback.print_exc()
            code = 1
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    return pid


def spawn_member(flow_file: str, spec: TaskSpec, env: dict[str, str]) -> Member:
    fd, path = tempfile.mkstemp(prefix="stoker-task-", suffix=".json")  # 0600: this user only
    with os.fdopen(fd, "w") as f:
        f.write(spec.to_json())
    proc = subprocess.Popen([sys.executable, flow_file, "_task", path], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **env},
                            start_new_session=True, preexec_fn=die_with_parent)
    fds = (os.dup(proc.stdout.fileno()), os.dup(proc.stderr.fileno()))  # type: ignore[union-attr]
    proc.stdout.close()  # type: ignore[union-attr]
    proc.stderr.close()  # type: ignore[union-attr]
    proc.stdout = proc.stderr = None
    return Member(proc.pid, fds, popen=proc, spec_file=path)
