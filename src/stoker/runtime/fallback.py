"""A task whose process died (SIGKILL, a segfault, out of memory): what its log says, and @catch's fallback.

As in Metaflow, a step with @catch gets up to FALLBACK_ATTEMPTS more attempts once its own (1 + @retry times)
are spent and the last one did not end in a caught exception (its process died, or it failed outside the
step's code). A fallback attempt does not run the step: it raises FailureHandledByCatch, which @catch stores
in its `var`, and the flow goes on.
"""

from __future__ import annotations

import signal
from typing import Any

from ..flow.decorators import get_decorator

FALLBACK_ATTEMPTS = 3  # Metaflow's NUM_FALLBACK_RETRIES


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


def wants_fallback(flow_cls: type, kind: str, unit: list[Any], first: Any) -> bool:
    """Whether a failed unit gets a fallback attempt: one non-gang task of a @catch step that @catch can complete
    (not a foreach, gang or switch step: `kind` is its graph node's), its own attempts spent, fewer than
    FALLBACK_ATTEMPTS fallbacks so far."""
    if len(unit) != 1 or first.gang or kind in ("foreach", "parallel", "switch") or \
            not get_decorator(getattr(flow_cls, first.step), "catch"):
        return False
    return first.max_attempts <= first.attempt + 1 < first.max_attempts + FALLBACK_ATTEMPTS
