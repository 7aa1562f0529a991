"""How a torchrun worker tells the task that launched it why it stopped.

torchrun exits with 1 whatever its workers' exit codes were (and with a SignalException traceback when it was
itself sent SIGTERM), so the codes that matter to the scheduler travel beside it: the task sets
``STOKER_EXIT_STATUS_DIR`` for torchrun's workers; a worker that ends with a preemption
(:data:`~stoker.errors.EXIT_PREEMPTED`) or a deterministic error (:data:`~stoker.errors.EXIT_PERMANENT`) writes
``rank<N>.json`` there (``stoker.train`` does; another entrypoint may call :func:`write_status`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from stoker.errors import EXIT_PERMANENT, EXIT_PREEMPTED, ConfigError, Preempted, StokerError

ENV = "STOKER_EXIT_STATUS_DIR"
EXIT_HANG = 79  # a task whose hang watchdog had to end it (its step did not unwind): cause `hang`


class TaskHang(StokerError):
    """The task (or its ranks) made no progress for its hang timeout: stopped, its stacks recorded (cause `hang`)."""

    exit_code = EXIT_HANG


def exit_code_for(exc: BaseException) -> int:
    """The process exit code that says what `exc` means: preempted (75), permanent (78), else 1."""
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    if isinstance(exc, Preempted):
        return EXIT_PREEMPTED
    if getattr(exc, "permanent", False):
        return EXIT_PERMANENT
    return exc.exit_code if isinstance(exc, StokerError) else 1


def write_status(code: int, exc: BaseException | None = None, env: dict[str, str] | None = None) -> None:
    """Record this rank's exit code (and the error's one line) where the launching task reads it; best effort."""
    env = os.environ if env is None else env
    folder = env.get(ENV)
    if not folder or code not in (EXIT_PREEMPTED, EXIT_PERMANENT):
        return
    rank = env.get("RANK", "0")
    doc = {"rank": int(rank) if rank.isdigit() else rank, "code": code,
           "type": type(exc).__name__ if exc is not None else "", "message": str(exc) if exc is not None else "",
           "step": getattr(exc, "step", None)}
    try:
        path = Path(folder) / f"rank{rank}.json"
        path.with_suffix(".tmp").write_text(json.dumps(doc))
        path.with_suffix(".tmp").replace(path)
    except OSError:
        pass


def read_statuses(folder: str | os.PathLike) -> list[dict[str, Any]]:
    """What the workers wrote, lowest rank first."""
    out = []
    for p in sorted(Path(folder).glob("rank*.json")):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(out, key=lambda d: d.get("rank") if isinstance(d.get("rank"), int) else 1 << 30)


def raise_for_statuses(folder: str | os.PathLike, fallback: BaseException) -> None:
    """After a failed torchrun: a deterministic error on any rank wins (no retry can help), then a preemption
    (retry and resume); otherwise `fallback` is raised as it is."""
    statuses = read_statuses(folder)
    permanent = [s for s in statuses if s.get("code") == EXIT_PERMANENT]
    if permanent:
        s = permanent[0]
        raise ConfigError(f"rank {s['rank']}: {s.get('message') or 'a deterministic error'}") from None
    preempted = [s for s in statuses if s.get("code") == EXIT_PREEMPTED]
    if preempted:
        steps = {s.get("step") for s in preempted}
        step = steps.pop() if len(steps) == 1 else None
        raise Preempted(preempted[0].get("message") or "preempted", step=step) from None
    raise fallback
