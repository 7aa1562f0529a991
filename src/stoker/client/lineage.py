"""What the client derives from task manifests and run records: a task's parents and children, its metadata
events with Metaflow's names, its log lines, and the run's graph."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

from stoker.client.base import Metadata
from stoker.store.blobs import BlobStore
from stoker.store.manifest import read_run_record

Task = Any  # a stoker.client.Task (not imported: client imports this module)

STREAMS = ("stdout", "stderr")


_STATIC: dict[tuple[str, str, str], dict[str, Any]] = {}  # (store, flow, run) -> the record's fixed fields


def _static_record(store: BlobStore, flow: str, run_id: str) -> dict[str, Any]:
    """The fields of a run's record that never change (graph, flow file), read once ({} if it wrote none)."""
    key = (store.url, flow, run_id)
    if key not in _STATIC:
        record = read_run_record(store, flow, run_id)
        if record is None:
            return {}
        if len(_STATIC) > 256:
            _STATIC.clear()
        _STATIC[key] = {"graph": record.get("graph") or {}, "flow_file": record.get("flow_file")}
    return _STATIC[key]


def run_graph(store: BlobStore, flow: str, run_id: str) -> dict[str, list[str]]:
    """{step: [next steps]} of a run, from its record ({} if the run wrote none)."""
    graph = _static_record(store, flow, run_id).get("graph") or {}
    return {k: list(v) for k, v in graph.items()}


def _in_run(task: Task, pathspec: str) -> str:
    """A parent pathspec moved into the task's run (a task cloned by resume names its origin run's parents)."""
    flow, _, step, task_id = pathspec.split("/")
    return f"{flow}/{task.run_id}/{step}/{task_id}"


def parent_task_pathspecs(task: Task) -> list[str]:
    """The tasks ``task`` read its inputs from (its manifest's input paths), those indexed in its run."""
    out = []
    for p in task.input_paths:
        p = _in_run(task, p)
        _, _, step, task_id = p.split("/")
        if task._db.get_task(task.flow_name, task.run_id, step, task_id) is not None and p not in out:
            out.append(p)
    return out


def child_task_pathspecs(task: Task) -> list[str]:
    """The tasks of the next steps that read ``task``'s outputs (those started so far)."""
    graph = run_graph(task._store, task.flow_name, task.run_id)
    nxt = graph.get(task.step_name) or list((task._m("next") or {}).get("steps") or [])
    out = []
    for step in nxt:
        for rec in task._db.list_tasks(task.flow_name, task.run_id, step):
            attempt = task._db.get_attempt(task.flow_name, task.run_id, step, rec.task_id)
            inputs = ((attempt.manifest or {}).get("input_paths") or []) if attempt else []
            if task.pathspec in (_in_run(task, p) for p in inputs):
                out.append(rec.pathspec)
    return out


def _foreach_path(task: Task, manifest: dict[str, Any]) -> str | None:
    """Metaflow's ``foreach-execution-path``: ``step:index`` per enclosing foreach, the step being the first
    one inside the foreach."""
    frames = manifest.get("foreach_stack") or []
    if not frames:
        return None
    graph = run_graph(task._store, task.flow_name, task.run_id)
    parts = []
    for f in frames:
        inner = (graph.get(f.get("step")) or [f.get("step")])[0]
        parts.append(f"{inner}:{f.get('index')}")
    return ",".join(parts)


def task_metadata(task: Task) -> list[Metadata]:
    """The metadata events of ``task``: one set per attempt (only the asked one if ``attempt=`` was given),
    each stamped (epoch ms) with its attempt's start, and its end for ``attempt_ok`` and ``attempt-done``."""
    run = task._db.get_run(task.flow_name, task.run_id)
    origin_run = run.origin_run_id if run is not None else None
    record = _static_record(task._store, task.flow_name, task.run_id)
    script = os.path.basename(record.get("flow_file") or "") or None
    store_url = task._store.url
    ds_type = store_url.split("://", 1)[0] if "://" in store_url else "local"
    attempts = task._db.list_attempts(task.flow_name, task.run_id, task.step_name, task.id)
    if task._asked_attempt is not None:
        attempts = [a for a in attempts if a.attempt == task._attempt_no]
    out: list[Metadata] = []
    for a in attempts:
        m = a.manifest or {}
        start = int((a.started_at or 0) * 1000)
        events: list[tuple[str, Any]] = [
            ("attempt", str(a.attempt)), ("origin-run-id", str(origin_run)), ("user", a.user or ""),
            ("runtime", "dev"), ("ds-type", ds_type), ("ds-root", store_url), ("status", a.status),
            ("hostname", a.hostname or ""), ("retry_count", str(m.get("retry_count", a.attempt)))]
        if script:
            events.append(("script-name", script))
        if m.get("python_version"):
            events.append(("python_version", str(m["python_version"])))
        if m.get("origin_task"):
            events.append(("origin-task-id", str(m["origin_task"]).rsplit("/", 1)[-1]))
        path = _foreach_path(task, m)
        if path:
            events.append(("foreach-execution-path", path))
        if m.get("catch_var"):
            events.append(("catch_var", str(m["catch_var"])))
        for k, v in (m.get("parallel") or {}).items():
            events.append((f"parallel_{k}", str(v)))
        out += [Metadata(name, value, start, name, task) for name, value in events]
        if a.status != "running":
            end = int((a.finished_at or a.started_at or 0) * 1000)
            out += [Metadata("attempt_ok", str(a.status == "ok"), end, "internal_attempt_status", task),
                    Metadata("attempt-done", str(a.attempt), end, "attempt-done", task)]
    return out


def loglines(task: Task, stream: str, as_unicode: bool = True) -> Iterator[tuple[datetime | None, Any]]:
    """``(timestamp, line)`` per line of the attempt's ``stream``; the timestamp is the attempt's start in naive
    UTC (stoker does not stamp lines)."""
    if stream not in STREAMS:
        raise ValueError(f"stream {stream!r} is not 'stdout' or 'stderr'")
    started = task._attempt.started_at if task._attempt is not None else None
    when = None if started is None else datetime.fromtimestamp(started, timezone.utc).replace(tzinfo=None)
    for line in task._log(stream).splitlines():
        yield when, (line if as_unicode else line.encode())
