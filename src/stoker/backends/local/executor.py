"""Local task processes: forked from the (single-threaded) scheduler by default, or spawned as
`python flow.py _task SPEC.json` (STOKER_TASK_LAUNCH=subprocess, or where fork is unavailable).

Forking skips interpreter start-up and re-importing the flow (a few ms a task instead of ~0.3 s); each task is
still its own process, in its own session so that a stop reaches torchrun and its workers too, and dies with
the scheduler (PR_SET_PDEATHSIG) so that a killed `run` leaves no orphans behind.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable

from ..._process import die_with_parent, signal_tree
from ...runtime.spec import TaskSpec
from ..base import Capabilities, Executor, TaskHandle


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux >= 5.3
        return None


def _nonblocking(*fds: int) -> None:
    for fd in fds:
        os.set_blocking(fd, False)


class ForkHandle(TaskHandle):
    def __init__(self, pid: int, fds: tuple[int, int]) -> None:
        self.pid, self.fds, self._code = pid, fds, None
        self.exit_fd = _pidfd(pid)

    def poll(self) -> int | None:
        if self._code is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self._code = -1
                return self._code
            if pid:
                self._code = os.waitstatus_to_exitcode(status)
        return self._code

    def signal(self, sig: int, tree: bool = True) -> None:
        signal_tree(self.pid, sig, tree)


class PopenHandle(TaskHandle):
    def __init__(self, proc: subprocess.Popen, spec_file: str) -> None:
        self.proc, self.pid, self._spec_file = proc, proc.pid, spec_file
        # the scheduler owns (and closes) the pipe fds: detach them from the Popen file objects
        self.fds = (os.dup(proc.stdout.fileno()), os.dup(proc.stderr.fileno()))  # type: ignore[union-attr]
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]
        proc.stdout = proc.stderr = None
        self.exit_fd = _pidfd(proc.pid)

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is not None and os.path.exists(self._spec_file):
            os.unlink(self._spec_file)
        return code

    def signal(self, sig: int, tree: bool = True) -> None:
        signal_tree(self.proc.pid, sig, tree)


class LocalExecutor(Executor):
    name = "local"

    def __init__(self, flow_file: str = "", mode: str | None = None) -> None:
        self.flow_file = flow_file
        mode = mode or os.environ.get("STOKER_TASK_LAUNCH", "fork")
        self.mode = "fork" if mode == "fork" and hasattr(os, "fork") else "subprocess"

    def capabilities(self) -> Capabilities:
        from ...monitor.host import local_gpu_count

        memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
        return Capabilities(multi_node=True, gpus=local_gpu_count(), cpus=os.cpu_count() or 1, memory_mb=memory_mb,
                            notes=["gang nodes share this machine; rendezvous on 127.0.0.1"])

    def launch(self, spec: TaskSpec, env: dict[str, str], entry: Callable[[], int]) -> TaskHandle:
        if self.mode == "fork":
            return self._fork(env, entry)
        return self._spawn(spec, env)

    def _fork(self, env: dict[str, str], entry: Callable[[], int]) -> ForkHandle:
        r_out, w_out = os.pipe()
        r_err, w_err = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the task process
            code = 1
            try:
                os.setsid()
                die_with_parent()
                if os.getppid() != parent:  # the scheduler died before prctl took effect
                    os._exit(1)
                os.close(r_out)
                os.close(r_err)
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(w_out, 1)
                os.dup2(w_err, 2)
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
                    signal.signal(sig, signal.SIG_DFL)
                sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
                sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
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
        os.close(w_out)
        os.close(w_err)
        _nonblocking(r_out, r_err)
        return ForkHandle(pid, (r_out, r_err))

    def _spawn(self, spec: TaskSpec, env: dict[str, str]) -> PopenHandle:
        fd, path = tempfile.mkstemp(prefix="stoker-task-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(spec.to_json())
        proc = subprocess.Popen([sys.executable, self.flow_file, "_task", path], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **env},
                                start_new_session=True, preexec_fn=die_with_parent)
        handle = PopenHandle(proc, path)
        _nonblocking(*handle.fds)
        return handle
