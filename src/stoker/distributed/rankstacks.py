"""Gather the stacks of a task's processes that installed the stack hook (`_rankhook/stackhook.py`): torchrun, its
ranks, a warm launcher's forked ranks, the task itself. Each is sent SIGUSR2 and its faulthandler dump is read back
from its `<pid>.stk` file; frames are printed as Python prints a traceback, innermost last.
"""

from __future__ import annotations

import json
import linecache
import os
import re
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from stoker.distributed._rankhook import stackhook

ENV = stackhook.ENV
HOOK_DIR = os.path.dirname(os.path.abspath(stackhook.__file__))
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+) \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


@dataclass
class ProcessStacks:
    pid: int
    rank: str | None
    host: str
    what: str  # "rank 1", "torchrun", "task"
    threads: list[tuple[str, list[tuple[str, int, str]]]] = field(default_factory=list)  # (name, frames outer first)
    note: str = ""

    def text(self) -> str:
        out = []
        for name, frames in self.threads:
            out.append(f"Thread {name}:")
            out.append("Traceback (most recent call last):")
            for path, line, func in frames:
                out.append(f'  File "{path}", line {line}, in {func}')
                src = linecache.getline(path, line).strip()
                if src:
                    out.append(f"    {src}")
        if self.note:
            out.append(self.note)
        return "\n".join(out)


def child_env(folder: str, env: dict[str, str] | os._Environ) -> dict[str, str]:
    """The variables that make a task's children install the hook: the folder, and the hook's folder first on
    PYTHONPATH (its `sitecustomize` hands over to the environment's own)."""
    path = env.get("PYTHONPATH", "")
    return {ENV: folder, "PYTHONPATH": HOOK_DIR + (os.pathsep + path if path else "")}


def last_progress(folder: str) -> float:
    """The latest output (wall-clock time) of any hooked process of the task, 0 when none wrote yet."""
    best = 0.0
    try:
        for e in os.scandir(folder):
            if e.name.endswith(".out"):
                try:
                    best = max(best, e.stat().st_mtime)
                except OSError:
                    continue
    except OSError:
        pass
    return best


def hooked(folder: str) -> dict[int, dict]:
    """pid -> the last header of every live hooked process in `folder` (a reused pid is left out)."""
    out: dict[int, dict] = {}
    for p in Path(folder).glob("*.stk"):
        try:
            pid = int(p.stem)
            heads = [ln for ln in p.read_text(errors="replace").splitlines() if ln.startswith("#stoker ")]
            head = json.loads(heads[-1][8:]) if heads else None
        except (ValueError, OSError):
            continue
        if head and head.get("start") and head["start"] == stackhook.start_time(pid):
            out[pid] = head
    return out


def is_rank(head: dict) -> bool:
    """Whether a hooked process is a rank (it has $RANK) or torchrun: what a hung gang's stop kills."""
    return head.get("rank") not in (None, "") or _what(head) == "torchrun"


def _what(head: dict) -> str:
    if head.get("rank") not in (None, ""):
        return f"rank {head['rank']}"
    argv = head.get("argv", "")
    return "torchrun" if "torch.distributed.run" in argv or "torchrun" in argv else \
        "warm launcher" if "stoker.distributed.zygote" in argv else "process"


def collect(folder: str, skip: set[int] = frozenset(), wait_s: float = 2.0) -> list[ProcessStacks]:
    """Every live hooked process's stacks (but those in `skip`), ranks in order."""
    heads = {pid: h for pid, h in hooked(folder).items() if pid not in skip}
    sizes = {}
    for pid in heads:
        path = os.path.join(folder, f"{pid}.stk")
        try:
            sizes[pid] = os.path.getsize(path)
            os.kill(pid, stackhook.SIGNAL)
        except OSError:
            sizes.pop(pid, None)
    deadline, last = time.monotonic() + wait_s, {}
    while time.monotonic() < deadline:  # until every dump has stopped growing
        time.sleep(0.1)
        now = {pid: _size(folder, pid) for pid in sizes}
        if all(now[p] > sizes[p] for p in sizes) and now == last:
            break
        last = now
    out = []
    for pid, size in sizes.items():
        h = heads[pid]
        ps = ProcessStacks(pid, h.get("rank"), h.get("host", ""), _what(h))
        try:
            with open(os.path.join(folder, f"{pid}.stk"), errors="replace") as f:
                f.seek(size)
                ps.threads = parse(f.read(), h.get("main"))
        except OSError as e:
            ps.note = f"(its stacks could not be read: {e})"
        if not ps.threads and not ps.note:
            ps.note = "(no answer: the process did not dump its stacks in time)"
        out.append(ps)
    return sorted(out, key=lambda p: (p.rank is None, int(p.rank) if (p.rank or "").isdigit() else 0, p.pid))


def _size(folder: str, pid: int) -> int:
    try:
        return os.path.getsize(os.path.join(folder, f"{pid}.stk"))
    except OSError:
        return 0


def parse(text: str, main: int | None = None) -> list[tuple[str, list[tuple[str, int, str]]]]:
    """faulthandler's dump (innermost frame first) as [(thread name, frames outermost first)]."""
    threads: list[tuple[str, list[tuple[str, int, str]]]] = []
    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            ident = int(m.group(2), 16)
            name = "MainThread" if ident == main else m.group(2)
            threads.append((f"{name}{' (it received the signal)' if m.group(1) == 'Current thread' else ''}", []))
            continue
        f = _FRAME.match(line)
        if f and threads:
            threads[-1][1].insert(0, (f.group(1), int(f.group(2)), f.group(3)))
    return threads


def own_stacks(skip_ident: int | None = None) -> list[tuple[str, list[tuple[str, int, str]]]]:
    """This process's threads, with their names (from Python, not a signal; but the thread asking, `skip_ident`)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        if ident == skip_ident:
            continue
        frames = [(fs.filename, fs.lineno or 0, fs.name) for fs in traceback.extract_stack(frame)]
        out.append((f"{names.get(ident, hex(ident))} ({hex(ident)})", frames))
    return out


def signal_all(folder: str, sig: int = signal.SIGKILL, skip: set[int] = frozenset()) -> list[int]:
    """Send `sig` to every live hooked process but those in `skip` (a hung gang's ranks: nothing to save)."""
    sent = []
    for pid in hooked(folder):
        if pid in skip:
            continue
        try:
            os.kill(pid, sig)
            sent.append(pid)
        except OSError:
            pass
    return sent
