"""What the UI shows about runs, read only from the metadata index and the blob store (never a process).

Every function returns plain JSON-able dicts; ``None`` means "no such run/step/task" (the API answers 404).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from stoker.client.gangs import step_gangs
from stoker.store.blobs import BlobStore
from stoker.store.manifest import read_run_record, run_prefix
from stoker.store.metadata import MetadataDB
from stoker.store.records import AttemptRecord, RunRecord
from stoker.store.runstate import LOST, RunState, run_state
from stoker.ui.dag import edges_from_manifests, edges_from_source, layout
from stoker.ui.goodput import cause_label

_SAFE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@+-]{0,127}$")
# a gang node stopped because another node failed says so in its exception message
_STOPPED_BY_OTHERS = ("because gang", "another task failed", "the run was interrupted")


def _duration(start: float | None, end: float | None, running: bool) -> float | None:
    if start is None:
        return None
    if end is None:
        return time.time() - start if running else None
    return end - start


def run_summary(r: RunRecord, state: RunState | None = None) -> dict[str, Any]:
    """A run as listed; ``state``: its status as shown (a running run whose driver is gone is ``lost``, with a
    note saying why and how to continue it: stoker.store.runstate)."""
    state = state or RunState(r.status)
    return {"flow": r.flow, "run_id": r.run_id, "status": state.status, "user": r.user,
            "created_at": r.created_at, "finished_at": r.finished_at,
            "duration": _duration(r.created_at, r.finished_at, state.status == "running"),
            "tags": list(r.user_tags), "system_tags": list(r.system_tags),
            "origin_run_id": r.origin_run_id, "note": state.note}


def list_runs(db: MetadataDB, store: BlobStore | None = None, *, flow: str | None = None, status: str | None = None,
              tag: str | None = None, limit: int = 200) -> dict[str, Any]:
    """The newest runs of every user (the UI shows every namespace), filtered by flow, status (``lost`` too) and
    tag. ``store``: where a running run's record is read, to tell a lost one."""
    indexed = "running" if status == LOST else status
    runs = db.list_runs(flow or None, tags=[tag] if tag else [], status=indexed or None, limit=limit)
    shown = [run_summary(r, run_state(store, r.flow, r.run_id, r.status)) for r in runs]
    if status:
        shown = [r for r in shown if r["status"] == status]
    return {"runs": shown, "flows": db.list_flows(), "now": time.time()}


def _attempt(a: AttemptRecord) -> dict[str, Any]:
    m = a.manifest or {}
    exc = m.get("exception") or None
    return {"attempt": a.attempt, "status": a.status, "started_at": a.started_at, "finished_at": a.finished_at,
            "duration": _duration(a.started_at, a.finished_at, a.status == "running"),
            "hostname": a.hostname, "node": (m.get("parallel") or {}).get("node_index"),
            "num_nodes": (m.get("parallel") or {}).get("num_nodes"),
            "exception": None if not exc else _exception(exc)}


def _exception(exc: dict[str, Any]) -> dict[str, Any]:
    """A failed attempt's exception with its cause (stoker.runtime.driver.causes: a kind, its label and the evidence
    in one line; None for an attempt recorded before causes were)."""
    kind = exc.get("cause") or None
    return {"type": exc.get("type", ""), "message": exc.get("message", ""), "traceback": exc.get("traceback", ""),
            "cause": kind, "cause_label": cause_label(kind), "evidence": exc.get("evidence") or None}


def _step_state(ok: int, failed: int, running: int, total: int) -> str:
    if running:
        return "running"
    if failed:
        return "failed"
    return "ok" if total and ok == total else "pending"


def first_failure(tasks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The failure to show on top of a failed run: the earliest failed attempt, preferring, in a gang, the node
    that failed on its own over the nodes stopped because of it (the first failing node)."""
    failed = [(t, a) for t in tasks for a in t["attempts"] if a["status"] == "failed" and a["exception"]]
    if not failed:
        return None

    def key(item: tuple[dict, dict]) -> tuple:
        exc = item[1]["exception"]
        stopped = (any(s in exc["message"] for s in _STOPPED_BY_OTHERS) or exc["cause"] == "cancelled"
                   or (exc["evidence"] or "").startswith("stopped with its gang"))
        return (stopped, item[1]["finished_at"] or 0.0)

    t, a = min(failed, key=key)
    return {"step": t["step"], "task_id": t["task_id"], "attempt": a["attempt"], "node": a["node"],
            **a["exception"]}


def live_attempts(store: BlobStore, home: Path, flow: str, run_id: str) -> set[tuple[str, str, int]]:
    """(step, task, attempt) of attempts that left traces but may not be indexed yet: the scheduler indexes an
    attempt when it ends, so while a task runs the UI finds it from what lands: the log the scheduler appends
    to under ``$STOKER_HOME/logs`` (local tasks), its log chunks and series in the store (remote tasks)."""
    found: set[tuple[str, str, int]] = set()
    local = home / "logs" / flow / run_id
    try:
        for step_dir in local.iterdir():
            for task_dir in step_dir.iterdir():
                task_id, _, attempt = task_dir.name.rpartition(".")
                if task_id and attempt.isdigit():
                    found.add((step_dir.name, task_id, int(attempt)))
    except OSError:
        pass
    base = run_prefix(flow, run_id)
    for name in store.list(base):
        parts = name[len(base):].split("/")
        if parts[0] in ("metrics", "monitor") and len(parts) >= 5 and parts[3].isdigit():
            found.add((parts[1], parts[2], int(parts[3])))
        elif len(parts) >= 4 and parts[2].isdigit() and (parts[3].endswith(".log") or ".log.parts" in parts[3]):
            found.add((parts[0], parts[1], int(parts[2])))
    return {f for f in found if all(map(_SAFE.match, f[:2]))}


def run_detail(db: MetadataDB, store: BlobStore, flow: str, run_id: str, home: Path | None = None
               ) -> dict[str, Any] | None:
    """A run: summary, parameters, steps with states, the DAG, every task with its attempts, the failure, and the
    generations of its gangs with hot spares (``gangs``: stoker.client.gangs.step_gangs)."""
    rec = db.get_run(flow, run_id)
    if rec is None:
        return None
    state = run_state(store, flow, run_id, rec.status)
    steps = db.list_steps(flow, run_id)
    tasks = []
    manifests = []
    for t in db.list_tasks(flow, run_id):
        attempts = db.list_attempts(flow, run_id, t.step, t.task_id)
        manifests += [a.manifest for a in attempts if a.manifest]
        shown = [_attempt(a) for a in attempts]
        tasks.append({"step": t.step, "task_id": t.task_id, "status": t.status, "attempt": t.attempt,
                      "node": shown[-1]["node"] if shown else None, "foreach_index": list(t.foreach_index),
                      "duration": _duration(t.started_at, t.finished_at, t.status == "running"),
                      "attempts": shown})
    if state.status == "running" and home is not None:
        known = {(t["step"], t["task_id"], a["attempt"]) for t in tasks for a in t["attempts"]}
        for step, task_id, attempt in sorted(live_attempts(store, home, flow, run_id) - known):
            a = {"attempt": attempt, "status": "running", "started_at": None, "finished_at": None, "duration": None,
                 "hostname": None, "node": None, "num_nodes": None, "exception": None}
            t = next((t for t in tasks if (t["step"], t["task_id"]) == (step, task_id)), None)
            if t is None:
                tasks.append({"step": step, "task_id": task_id, "status": "running", "attempt": attempt, "node": None,
                              "foreach_index": [], "duration": None, "attempts": [a]})
            elif attempt > t["attempt"]:  # a retry running
                t["attempts"].append(a)
                t["status"], t["attempt"] = "running", attempt
    states = {s.step: _step_state(s.num_ok, s.num_failed, s.num_running, s.num_tasks) for s in steps}
    try:
        record = read_run_record(store, flow, run_id) or {}
    except Exception:  # noqa: BLE001 - a torn or unreadable record: the index still says enough
        record = {}
    edges = record.get("graph") or edges_from_source(record.get("flow_file"), flow) or edges_from_manifests(manifests)
    for t in tasks:
        if t["status"] == "running":
            states[t["step"]] = "running"
    for name in {*states, *(t["step"] for t in tasks)}:
        edges.setdefault(name, [])
    try:  # gangs with hot spares: their generations (which node left, which spare joined, the recovery time)
        gangs = step_gangs(store, flow, run_id)
    except Exception:  # noqa: BLE001 - unreadable objects: the rest of the page still shows
        gangs = []
    return {"run": run_summary(rec, state), "params": rec.params,
            "steps": [{"name": s.step, "state": states[s.step], "num_tasks": s.num_tasks, "ok": s.num_ok,
                       "failed": s.num_failed, "running": s.num_running, "created_at": s.created_at,
                       "finished_at": s.finished_at} for s in steps],
            "dag": layout(edges, states), "tasks": tasks,
            "failure": first_failure(tasks) if rec.status != "succeeded" else None,
            "guardian": record.get("guardian"), "gangs": gangs}


def task_exists(db: MetadataDB, flow: str, run_id: str, step: str, task_id: str) -> bool:
    return db.get_task(flow, run_id, step, task_id) is not None
