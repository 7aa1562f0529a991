"""`stoker logs FLOW/RUN/STEP[/TASK]`: every task's log of a step (every node of a gang), each line prefixed
with its task (and node, and attempt with --all-attempts)."""

from __future__ import annotations

import sys

from ..errors import ConfigError


def print_logs(pathspec: str, stderr: bool = False, attempt: int | None = None, all_attempts: bool = False) -> int:
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
    shown = [a for t in tasks for a in (t.attempts if all_attempts else [t])]
    many = len(shown) > 1
    for t in shown:
        label = t.id
        node = (t.parallel or {}).get("node_index")
        if node is not None:
            label += f" node {node}"
        if all_attempts:
            label += f" attempt {t.retry_count}"
        for line in getattr(t, stream).splitlines():
            sys.stdout.write(f"[{label}] {line}\n" if many else f"{line}\n")
    return 0
