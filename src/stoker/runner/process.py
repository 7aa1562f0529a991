"""The subprocess under a Runner: started synchronously (output teed to log files, and to the console with
`show_output`) or asynchronously (output to log files only), waited on, streamed line by line, killed.

This follows Metaflow's `metaflow.runner.subprocess_manager` (2.19): the same log files, the same statuses, the
same `stream_log` positions. The run id comes back through a "runner attribute file", a FIFO the flow process
writes one JSON object to (`--runner-attribute-file`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any


def _exited(proc: Any) -> bool:
    if isinstance(proc, asyncio.subprocess.Process):
        return proc.returncode is not None
    return proc.poll() is not None


GUARDIAN = "stoker.cli.guardian"  # `python -m stoker.cli.guardian`: cancels a dead run's cluster jobs


def kill_tree(pid: int, grace: float = 2.0) -> None:
    """SIGTERM the flow process (it stops its tasks and marks the run killed), SIGKILL what is left after
    `grace` seconds: the process and every descendant but the run's guardian, which then cancels the run's
    Slurm / Batch jobs that are still live (killed too, it would leave them running)."""
    import psutil

    def guardian(p: Any) -> bool:
        try:
            return GUARDIAN in p.cmdline()
        except psutil.Error:
            return False

    try:
        kids = [p for p in psutil.Process(pid).children(recursive=True) if not guardian(p)]
    except psutil.Error:
        kids = []
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.time() + grace
    while time.time() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.Error:
            break
        time.sleep(0.05)
    for p in [*kids, pid]:
        with contextlib.suppress(Exception):
            (psutil.Process(p) if isinstance(p, int) else p).kill()


class CommandManager:
    """One flow process: its command, its log files (`log_files["stdout"|"stderr"]`), its state."""

    def __init__(self, command: list[str], env: dict[str, str] | None = None, cwd: str | None = None) -> None:
        self.command = command
        self.env = env if env is not None else os.environ.copy()
        self.cwd = cwd or os.getcwd()
        self.process: Any = None
        self.run_called = False
        self.timeout = False
        self.log_files: dict[str, str] = {}
        self.temp_dir: str | None = None
        self._threads: list[threading.Thread] = []

    def _log_paths(self) -> tuple[str, str]:
        self.temp_dir = tempfile.mkdtemp(prefix="stoker-runner-")
        return os.path.join(self.temp_dir, "stdout.log"), os.path.join(self.temp_dir, "stderr.log")

    def run(self, show_output: bool = False) -> int:
        """Start the process; its output goes to the log files (and to this process's stdout with
        `show_output`, as Metaflow does: both streams). Returns the pid; does not wait."""
        if self.run_called:
            raise RuntimeError(f"Command '{' '.join(self.command)}' has already been called. "
                               "Please create another CommandManager object.")
        out_path, err_path = self._log_paths()
        self.process = subprocess.Popen(self.command, cwd=self.cwd, env=self.env, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, bufsize=1, universal_newlines=True,
                                        encoding="utf-8", errors="replace")
        self.log_files = {"stdout": out_path, "stderr": err_path}
        self.run_called = True

        def tee(pipe: Any, path: str) -> None:
            with open(path, "w", encoding="utf-8") as f:
                for line in iter(pipe.readline, ""):
                    if show_output:
                        sys.stdout.write(line)
                    f.write(line)
                    f.flush()
            pipe.close()

        self._threads = [threading.Thread(target=tee, args=(self.process.stdout, out_path), daemon=True),
                         threading.Thread(target=tee, args=(self.process.stderr, err_path), daemon=True)]
        for t in self._threads:
            t.start()
        return self.process.pid

    async def async_run(self) -> int:
        """Start the process without waiting; output to the log files only. Returns the pid."""
        if self.run_called:
            raise RuntimeError(f"Command '{' '.join(self.command)}' has already been called. "
                               "Please create another CommandManager object.")
        out_path, err_path = self._log_paths()
        with open(out_path, "w", encoding="utf-8") as out, open(err_path, "w", encoding="utf-8") as err:
            self.process = await asyncio.create_subprocess_exec(*self.command, cwd=self.cwd, env=self.env,
                                                                stdout=out, stderr=err)
        self.log_files = {"stdout": out_path, "stderr": err_path}
        self.run_called = True
        return self.process.pid

    def sync_wait(self) -> None:
        """Wait for a process started with `run` (and for its output to reach the log files)."""
        if not self.run_called:
            raise RuntimeError("No command run yet to wait for...")
        old = None
        if threading.current_thread() is threading.main_thread():
            def on_sigint(signum: int, frame: Any) -> None:  # the flow stops its tasks; then we stop too
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.process.pid, signal.SIGINT)
            old = signal.signal(signal.SIGINT, on_sigint)
        try:
            self.process.wait()
        finally:
            if old is not None:
                signal.signal(signal.SIGINT, old)
        for t in self._threads:
            t.join()

    async def wait(self, timeout: float | None = None, stream: str | None = None) -> None:
        """Wait for the process (killing it after `timeout` seconds), printing `stream` meanwhile if given."""
        if not self.run_called:
            raise RuntimeError("No command run yet to wait for...")
        waiter = self.process.wait() if stream is None else self.emit_logs(stream)
        if timeout is None:
            await waiter
            return
        try:
            await asyncio.wait_for(waiter, timeout)
        except asyncio.TimeoutError:
            self.timeout = True
            await asyncio.to_thread(kill_tree, self.process.pid, 2.0)
            await self.process.wait()
            print(f"Timeout: The process (PID {self.process.pid}; command: '{' '.join(self.command)}') did not "
                  f"complete within {timeout} seconds.")

    async def stream_log(self, stream: str, position: int | None = None,
                         log_write_delay: float = 0.01) -> AsyncIterator[tuple[int, str]]:
        """(position after the line, line without its newline) for each line of `stream`, until the process
        has ended and the file is read; `position` resumes from a position given before."""
        if not self.run_called:
            raise RuntimeError("No command run yet to get the logs for...")
        if stream not in self.log_files:
            raise ValueError(f"No log file found for '{stream}', valid values are: {', '.join(self.log_files)}")
        with open(self.log_files[stream], encoding="utf-8") as f:
            if position is not None:
                f.seek(position)
            while True:
                await asyncio.sleep(log_write_delay)
                line = f.readline()
                if not line:
                    if self.process.returncode is not None or _exited(self.process):
                        rest = f.readline()
                        if not rest:
                            break
                        line = rest
                    else:
                        continue
                yield f.tell(), line.rstrip()

    async def emit_logs(self, stream: str = "stdout", custom_logger: Callable[..., None] = print) -> None:
        """Print every line of `stream` (with `custom_logger`) until the process ends."""
        async for _, line in self.stream_log(stream):
            custom_logger(line)

    def kill(self, termination_timeout: float = 2) -> None:
        """Stop the process and its descendants (SIGTERM, then SIGKILL after `termination_timeout`)."""
        if self.process is not None:
            kill_tree(self.process.pid, termination_timeout)

    def cleanup(self) -> None:
        """Delete the log files."""
        if self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


class SubprocessManager:
    """The processes of one Runner, by pid."""

    def __init__(self) -> None:
        self.commands: dict[int, CommandManager] = {}

    def run_command(self, command: list[str], env: dict[str, str] | None = None, cwd: str | None = None,
                    show_output: bool = False) -> int:
        cmd = CommandManager(command, env, cwd)
        pid = cmd.run(show_output=show_output)
        self.commands[pid] = cmd
        return pid

    async def async_run_command(self, command: list[str], env: dict[str, str] | None = None,
                                cwd: str | None = None) -> int:
        cmd = CommandManager(command, env, cwd)
        pid = await cmd.async_run()
        self.commands[pid] = cmd
        return pid

    def get(self, pid: int) -> CommandManager | None:
        return self.commands.get(pid)

    def cleanup(self) -> None:
        for cmd in self.commands.values():
            cmd.cleanup()


@contextlib.contextmanager
def temporary_fifo() -> Iterator[tuple[str, int]]:
    """A FIFO in a temporary folder, its read side open (non-blocking): (path, fd)."""
    with tempfile.TemporaryDirectory(prefix="stoker-runner-") as tmp:
        path = os.path.join(tmp, "fifo")
        os.mkfifo(path)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            yield path, fd
        finally:
            os.close(fd)


def read_fifo(fd: int, cmd: CommandManager, timeout: float) -> str:
    """What the flow process writes to the runner attribute FIFO; raises `subprocess.CalledProcessError` when the
    process fails before writing, `TimeoutError` after `timeout` seconds."""
    content = bytearray()
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    deadline = time.time() + timeout
    while True:
        if _exited(cmd.process) and cmd.process.returncode != 0:
            raise subprocess.CalledProcessError(cmd.process.returncode, cmd.command)
        if time.time() > deadline:
            raise TimeoutError("Timeout while waiting for the file content")
        events = poll.poll(10)
        try:
            data = os.read(fd, 8192)
        except BlockingIOError:
            continue
        if data:
            content += data
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
            while chunk := os.read(fd, 8192):
                content += chunk
            break
        if events:  # EOF: the writer opened and closed it
            break
        if _exited(cmd.process):  # exited 0 without writing
            break
    if not content:
        raise subprocess.CalledProcessError(cmd.process.returncode or 0, cmd.command)
    return content.decode("utf-8")


def process_error_message(cmd: CommandManager) -> str:
    """Metaflow's message for a flow process that failed before its run started: the command and its output."""
    def read(stream: str) -> str:
        try:
            with open(cmd.log_files[stream], encoding="utf-8") as f:
                return f.read()
        except (KeyError, OSError):
            return ""

    msg = f"Error executing: '{' '.join(cmd.command)}':\n"
    if (out := read("stdout")).strip():
        msg += f"\nStdout:\n{out}\n"
    if (err := read("stderr")).strip():
        msg += f"\nStderr:\n{err}\n"
    return msg
