"""Live task output: lines prefixed `[run/step/task]`, full logs per attempt, and a compact progress line."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections import Counter, deque
from pathlib import Path
from typing import IO, Any

from stoker.redact import known_secrets

REDACTED = b"***"
STYLES = ["cyan", "magenta", "green", "yellow", "blue", "bright_cyan", "bright_magenta", "bright_green"]


class TaskOutput:
    """Collects one attempt's stdout/stderr: appends to log files and yields complete lines."""

    def __init__(self, log_dir: Path | str, prefix: str, lazy: bool = False) -> None:
        """``lazy``: create the folder and files when the first output arrives (most tasks of a wide foreach
        print nothing, and creating them is a good part of what the scheduler spends on a task)."""
        self.prefix, self._log_dir = prefix, log_dir
        self.files: dict[str, IO[bytes]] = {} if lazy else self._open()
        self.partial = {"stdout": b"", "stderr": b""}
        self.tail: deque[str] = deque(maxlen=30)
        # a run with secret parameters: what a task prints is kept and shown line by line, each value as ***
        self.secrets = [v.encode() for v in known_secrets()]

    @property
    def log_dir(self) -> Path:
        return Path(self._log_dir)

    @property
    def paths(self) -> dict[str, Path]:
        return {s: self.log_dir / f"{s}.log" for s in ("stdout", "stderr")}

    def _open(self) -> dict[str, IO[bytes]]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        return _open_logs(self.log_dir, list(self.paths))

    def feed(self, stream: str, data: bytes) -> list[str]:
        if not self.files:
            self.files = self._open()
        buf = self.partial[stream] + data
        *lines, self.partial[stream] = buf.split(b"\n")
        if self.secrets:  # whole lines only, so a value split between two reads is still found
            lines = [self._redact(ln) for ln in lines]
            if lines:
                self.files[stream].write(b"\n".join(lines) + b"\n")
        else:
            self.files[stream].write(data)
        out = [ln.decode("utf-8", "replace") for ln in lines]
        self.tail.extend(f"{stream}: {ln}" if stream == "stderr" else ln for ln in out)
        return out

    def close(self) -> list[tuple[str, str]]:
        rest = []
        for s, p in self.partial.items():
            if p and self.secrets:
                p = self._redact(p)
                self.files[s].write(p)
            if p:
                line = p.decode("utf-8", "replace")
                rest.append((s, line))
                self.tail.append(line)
            self.partial[s] = b""
            if s in self.files:
                self.files[s].close()
        return rest

    def _redact(self, line: bytes) -> bytes:
        for v in self.secrets:
            line = line.replace(v, REDACTED)
        return line

    def read(self, stream: str) -> bytes:
        """What the stream's log holds (nothing if a lazy one never got any output)."""
        return self.paths[stream].read_bytes() if self.files else b""


def store_logs(store: Any, t: Any, name_of: Any) -> None:
    """Store an ended task's stdout and stderr (`name_of(stream)` names each): a local task's from what it printed
    (an empty log is not stored: readers find none and show nothing); a remote one uploads its own, so only when
    it did not (killed hard), from the engine's copy or what was streamed here."""
    for stream in ("stdout", "stderr"):
        name = name_of(stream)
        if not t.backend.remote:
            data = t.output.read(stream)
            if data:
                store.write(name, data, durable=False)
        elif not store.exists(name):
            data = t.backend.logs(t.job, t.member, stream) or t.output.read(stream)
            store.write(name, data, durable=False)


def private_log_root() -> Path:
    """A fresh folder only this user can enter (``mkdtemp``: mode 0700), for a scheduler given no log folder.
    Never a predictable shared path such as ``/tmp/stoker-logs``, where another user could plant symlinks."""
    return Path(tempfile.mkdtemp(prefix="stoker-logs-"))


def _open_logs(log_dir: Path, streams: list[str]) -> dict[str, IO[bytes]]:
    """``<stream>.log`` files in ``log_dir``, created 0600 without following a symlink: neither the folder nor
    a file planted in it may redirect a task's output (which can hold secrets) elsewhere."""
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    try:
        dfd = os.open(log_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | nofollow)
    except OSError as e:
        raise OSError(e.errno, f"task log folder {log_dir} cannot be opened ({e.strerror}); it must be a real "
                               f"folder, not a symlink") from None
    files: dict[str, IO[bytes]] = {}
    try:
        for s in streams:
            try:
                fd = os.open(f"{s}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | nofollow, 0o600,
                             dir_fd=dfd)
            except OSError as e:
                raise OSError(e.errno, f"task log {log_dir / (s + '.log')} cannot be created ({e.strerror}); "
                                       f"remove it if it is a symlink") from None
            files[s] = os.fdopen(fd, "wb")
    except BaseException:
        for f in files.values():
            f.close()
        raise
    finally:
        os.close(dfd)
    return files


class Display:
    """Prints prefixed task lines. On a terminal (rich) lines are coloured by step and a one-line progress
    summary stays at the bottom; elsewhere (CI, files, pipes) lines are plain and rich is never imported."""

    def __init__(self, run_label: str, quiet: bool = False, console: Any = None) -> None:
        self.quiet = quiet
        self.run_label = run_label
        self.counts: Counter[str] = Counter()
        self.started = time.time()
        self._styles: dict[str, str] = {}
        self._last = 0.0
        self._gangs = None  # a GangView once a gang runs
        self.console = console
        self.live = None
        if console is None and sys.stdout.isatty() and not os.environ.get("CI"):
            from rich.console import Console
            from rich.live import Live

            self.console = Console(file=sys.stdout, highlight=False, soft_wrap=True)
            if not quiet:
                self.live = Live(self._summary(), console=self.console, auto_refresh=False, transient=True)
                self.live.start()

    def _style(self, step: str) -> str:
        return self._styles.setdefault(step, STYLES[len(self._styles) % len(STYLES)])

    def _emit(self, parts: list[tuple[str, str]]) -> None:
        if self.console is None:
            sys.stdout.write("".join(text for text, _ in parts) + "\n")
            sys.stdout.flush()
            return
        from rich.text import Text

        t = Text()
        for text, style in parts:
            t.append(text, style=style)
        self.console.print(t)

    def line(self, step: str, prefix: str, text: str, stream: str = "stdout") -> None:
        if not self.quiet:
            self._emit([(f"[{prefix}] ", self._style(step)), (text, "red" if stream == "stderr" else "")])

    def info(self, text: str, style: str = "") -> None:
        self._emit([(text, style)])

    def gang(self, key: Any, label: str, states: list[str], now: float | None = None) -> None:
        """One line with each node's state of a gang, when they changed (see :mod:`.gangview`)."""
        if self.quiet:
            return
        if self._gangs is None:
            from stoker.runtime.driver.gangview import GangView

            self._gangs = GangView()
        text = self._gangs.line(key, label, states, now)
        if text:
            self.info(text, style="dim")

    def count(self, state: str, delta: int = 1) -> None:
        self.counts[state] += delta

    def _summary(self) -> Any:
        from rich.text import Text

        c = self.counts
        return Text(f"{self.run_label}: {c['running']} running · {c['done']} done · {c['failed']} failed · "
                    f"{time.time() - self.started:.0f}s", style="dim")

    def refresh(self) -> None:
        if self.live and time.time() - self._last > 0.2:
            self.live.update(self._summary(), refresh=True)
            self._last = time.time()

    def close(self) -> None:
        if self.live:
            self.live.stop()
