"""A process's stacks and progress, for `stoker stacks` and hang detection (runtime/member/watchdog.py).

`install()` (once `$STOKER_STACKS_DIR` is set) makes this process
- dump the stack of every thread into `<dir>/<pid>.stk` on SIGUSR2 (`faulthandler.register`: the dump is written by C
  code in the signal handler, so it works while the main thread is stuck in a collective or a C call), after a
  header line `#stoker {...}` naming its pid, rank, host and start time (so a reused pid is never signalled);
- touch `<dir>/<pid>.out` (at most once a second) whenever it writes to sys.stdout or sys.stderr: its progress.
A forked child is not hooked (it may reset SIGUSR2, as stoker's reaper does) unless it installs the hook itself, as
a warm launcher's rank does once its environment is set (zygote.py). Imports nothing of stoker: a rank
loads it from `sitecustomize` before anything else.
"""

import faulthandler
import json
import os
import signal
import sys
import threading
import time

ENV = "STOKER_STACKS_DIR"
SIGNAL = signal.SIGUSR2
_STATE = "_stoker_stackhook"  # kept on `sys`: this module may be imported under two names in one process


def start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), "" where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def install(folder: str = "") -> None:
    """Register the dump and the progress mark for this process; again after a change of rank (a warm rank's env)."""
    folder = folder or os.environ.get(ENV, "")
    if not folder:
        return
    pid = os.getpid()
    state = getattr(sys, _STATE, None)
    if state is None or state["pid"] != pid or state["folder"] != folder:
        stk = open(os.path.join(folder, f"{pid}.stk"), "a", buffering=1)  # noqa: SIM115 - open as long as we run
        state = {"pid": pid, "folder": folder, "file": stk, "out": os.path.join(folder, f"{pid}.out"), "last": 0.0}
        setattr(sys, _STATE, state)
        faulthandler.register(SIGNAL, file=stk, all_threads=True, chain=False)
    head = {"pid": pid, "rank": os.environ.get("RANK"), "local_rank": os.environ.get("LOCAL_RANK"),
            "host": os.uname().nodename, "start": start_time(pid), "main": threading.main_thread().ident,
            "argv": " ".join(getattr(sys, "orig_argv", sys.argv))[:300]}
    state["file"].write("#stoker " + json.dumps(head) + "\n")
    state["file"].flush()
    mark(force=True)
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name, None)
        if stream is not None and type(stream).__name__ != "_Marked":  # (maybe from this module's other name)
            setattr(sys, name, _Marked(stream))


def uninstall() -> None:
    """Undo `install` in this process (a task whose step has ended)."""
    state = getattr(sys, _STATE, None)
    if state is None:
        return
    faulthandler.unregister(SIGNAL)
    delattr(sys, _STATE)
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name, None)
        if type(stream).__name__ == "_Marked":
            setattr(sys, name, stream._stream)
    try:
        state["file"].close()
    except OSError:
        pass


def mark(force: bool = False) -> None:
    """This process made progress: touch its `.out` file (at most once a second)."""
    state = getattr(sys, _STATE, None)
    if state is None or state["pid"] != os.getpid():
        return
    now = time.monotonic()
    if not force and now - state["last"] < 1.0:
        return
    state["last"] = now
    try:
        with open(state["out"], "a"):
            os.utime(state["out"])
    except OSError:
        pass


class _Marked:
    """A text stream that marks progress on every write and is the stream it wraps otherwise."""

    def __init__(self, stream: object) -> None:
        self.__dict__["_stream"] = stream

    def write(self, s: str) -> int:
        if s:
            mark()
        return self._stream.write(s)

    def writelines(self, lines: object) -> None:
        mark()
        self._stream.writelines(lines)

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)

    def __setattr__(self, name: str, value: object) -> None:
        setattr(self._stream, name, value)
