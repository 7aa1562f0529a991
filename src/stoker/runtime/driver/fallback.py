"""A task whose process died (SIGKILL, a segfault, out of memory): what its log says, and fallback attempts.

A decorator may offer fallback attempts once a step's own are spent and the last one did not end in an
exception its decorators handled (its process died, or it failed outside the step's code): @catch's record the
failure and the flow goes on (stoker.features.catch).
"""

from __future__ import annotations

import signal
from typing import Any

from stoker.features.hooks import fallback_attempts


def died_how(code: int) -> str:
    """`killed by signal SIGKILL` for a negative exit code, else `exited with code N`."""
    if code < 0:
        sig = -code
        return f"killed by signal {signal.Signals(sig).name if sig in signal.valid_signals() else sig}"
    return f"exited with code {code}"


def crash_note(code: int, why: str | None = None) -> str:
    """The line a dead task's stderr ends with (Metaflow: "Task failed." / "... with a segmentation fault.")."""
    seg = code == -signal.SIGSEGV
    how = died_how(code)
    return (f"Task failed{' with a segmentation fault' if seg else ''}: its process "
            f"{'was ' if code < 0 else ''}{how}" + (f" because {why}" if why else "") + ".\n")


def fallback_note(flow_cls: type, kind: str, unit: list[Any], first: Any) -> str:
    """What the run prints when a failed unit gets a fallback attempt, else "": one task, or one gang (its nodes
    fall back together: each records the failure, as Metaflow's control task does when a node of its gang dies),
    of a step whose decorators offer fallback attempts for its kind of graph node (`kind`), its own attempts spent,
    fewer fallbacks so far than offered."""
    if len(unit) != 1 and not first.gang:
        return ""
    n, note = fallback_attempts(getattr(flow_cls, first.step), kind)
    return note if n and first.max_attempts <= first.attempt + 1 < first.max_attempts + n else ""


def wants_fallback(flow_cls: type, kind: str, unit: list[Any], first: Any) -> bool:
    return bool(fallback_note(flow_cls, kind, unit, first))
