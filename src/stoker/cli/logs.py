"""`stoker logs FLOW/RUN/STEP[/TASK]`: every task's log of a step, each line prefixed with its task."""

from __future__ import annotations

import sys

from ..errors import ConfigError


def print_logs(pathspec: str, stderr: bool = False, attempt: int | None = None) -> int:
    from ..store import Run, Task

    parts = pathspec.strip("/").split("/")
    if len(parts) < 3:
        raise ConfigError(f"logs {pathspec}: give FLOW/RUN/STEP or FLOW/RUN/STEP/TASK")
    if len(parts) == 3:
        step = Run("/".join(parts[:2]))[parts[2]]
        tasks = sorted(step, key=lambda t: int(t.id) if t.id.isdigit() else t.id)
    else:
        tasks = [Task("/".join(parts[:4]), attempt=attempt)]
    stream = "stderr" if stderr else "stdout"
    many = len(tasks) > 1
    for t in tasks:
        text = getattr(t, stream)
        for line in text.splitlines():
            sys.stdout.write(f"[{t.id}] {line}\n" if many else f"{line}\n")
    return 0
