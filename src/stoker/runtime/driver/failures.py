"""What a failed attempt means for its retries: preempted (retry and resume), permanent (never retry), or neither.

A task says so with its exit code (:data:`~stoker.errors.EXIT_PREEMPTED` = 75,
:data:`~stoker.errors.EXIT_PERMANENT` = 78) and, more reliably across engines (a Slurm or Batch exit code is
often the job's, not the task's), in its manifest's ``exception`` (``preempted`` / ``permanent``).

- A preemption (SIGTERM, then a committed checkpoint) is retried without counting against ``@retry``, up to
  ``$STOKER_MAX_PREEMPTIONS`` times per task (default 10); the retry resumes from the checkpoint.
- A permanent error (a :class:`~stoker.errors.ConfigError` raised in the step or in ``stoker.train``, or exit code
  78) is never retried, not even under ``@retry``: the run fails at once with the error's one line.

Every failed attempt's cause (these two among nine others) is found by runtime/driver/causes.py; what it means for
the retries is decided in runtime/driver/attribution.py.
"""

from __future__ import annotations

import os
from typing import Any

from stoker._process import kill_grace  # noqa: F401  (its home: process lifetimes; imported from here too)
from stoker.errors import EXIT_PERMANENT, EXIT_PREEMPTED

PREEMPTED, PERMANENT = "preempted", "permanent"
# the run's final hint says "fix it and run again" (not `resume`) when every failure carries this (a deterministic
# cause's "not retried" line: runtime/driver/attribution.py)
FIX_AND_RERUN = "running it again fails the same way"


def max_preemptions(env: dict[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    try:
        return max(0, int(env.get("STOKER_MAX_PREEMPTIONS", "10")))
    except ValueError:
        return 10


def failure_kind(manifest: dict | None, exit_code: int | None) -> str | None:
    exc = (manifest or {}).get("exception") or {}
    if exc.get("permanent") or exit_code == EXIT_PERMANENT:
        return PERMANENT
    if exc.get("preempted") or exit_code == EXIT_PREEMPTED:
        return PREEMPTED
    return None


def resume_step(manifest: dict | None) -> Any:
    return ((manifest or {}).get("exception") or {}).get("resume_step")


def requeue_preempted(unit: list[Any], first: Any) -> str | None:
    """Count a preemption retry on the unit's tasks (not against @retry); returns the line to show, or None when
    the task was preempted more than $STOKER_MAX_PREEMPTIONS times (then it is an ordinary failure)."""
    done = getattr(first, "preemptions", 0)
    if done >= max_preemptions():
        return None
    for g in unit:
        g.preemptions = done + 1
        g.max_attempts += 1  # the retry does not use up one of @retry's attempts
    step = resume_step(first.manifest)
    where = f"resuming from step {step}" if step is not None else "resuming from its last checkpoint"
    return f"preempted; {where} (preemption {done + 1} of at most {max_preemptions()})"

