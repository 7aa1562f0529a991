"""What the "default" card shows around the user's components, like Metaflow's default card: the task's
identity and timing, its error when it failed, its parameters and its artifacts (name, type, size, preview)."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any


def human_size(n: Any) -> str:
    try:
        n = float(n)
    except (TypeError, ValueError):
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def human_duration(seconds: Any) -> str:
    try:
        s = float(seconds)
    except (TypeError, ValueError):
        return "-"
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m {int(s % 60)}s"
    return f"{int(s // 3600)}h {int(s % 3600 // 60)}m"


def _when(t: float | None) -> str:
    return dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S") if t else "-"


def artifact_rows(artifacts: dict[str, Any], names: set[str] | None = None) -> list[list[Any]]:
    """[name, type, size, preview] rows of artifact descriptors (private `_names` left out)."""
    rows = []
    for name in sorted(artifacts):
        if name.startswith("_") or (names is not None and name not in names):
            continue
        d = artifacts[name] if isinstance(artifacts[name], dict) else {}
        rows.append([name, d.get("type", "-"), human_size(d.get("size")), d.get("repr", "")])
    return rows


def default_card_parts(spec: Any, started: float, artifacts: dict[str, Any] | None,
                       manifest: dict[str, Any] | None) -> dict[str, list[dict[str, Any]]]:
    """{"head": components before the user's, "tail": components after them}, as JSON dicts."""
    pathspec = f"{spec.flow}/{spec.run_id}/{spec.step}/{spec.task_id}"
    status = (manifest or {}).get("status")
    if status is None:
        status = "failed" if (manifest or {}).get("exception") else ("running" if manifest is None else "ok")
    finished = (manifest or {}).get("finished_at") or (time.time() if manifest is not None else None)
    info = [["task", pathspec], ["attempt", spec.attempt], ["status", status], ["started", _when(started)],
            ["finished", _when(finished) if manifest is not None else "-"],
            ["duration", human_duration((finished or time.time()) - started)], ["user", spec.user]]
    if spec.parallel:
        info.append(["gang node", f"{spec.parallel.node_index} of {spec.parallel.num_nodes}"])
    head: list[dict[str, Any]] = [
        {"type": "markdown", "text": f"# Task {spec.step}/{spec.task_id}"},
        {"type": "table", "headers": [], "data": info},
    ]
    tail: list[dict[str, Any]] = []
    exc = (manifest or {}).get("exception")
    if exc:
        tail.append({"type": "markdown", "text": "## Error"})
        tail.append({"type": "error", "message": f"{exc.get('type')}: {exc.get('message')}\n\n"
                                                 f"{exc.get('traceback') or ''}".rstrip()})
    if artifacts is None:
        tail.append({"type": "markdown", "text": "_The task's artifacts are shown when it ends._"})
        return {"head": head, "tail": tail}
    params = set(getattr(spec, "run_inputs", {}) or {})
    prow = artifact_rows(artifacts, params)
    if prow:
        tail.append({"type": "markdown", "text": "## Parameters"})
        tail.append({"type": "table", "headers": ["name", "type", "size", "value"], "data": prow})
    arows = artifact_rows({k: v for k, v in artifacts.items() if k not in params})
    tail.append({"type": "markdown", "text": "## Artifacts"})
    if arows:
        tail.append({"type": "table", "headers": ["name", "type", "size", "preview"], "data": arows})
    else:
        tail.append({"type": "markdown", "text": "_No artifacts._"})
    return {"head": head, "tail": tail}
