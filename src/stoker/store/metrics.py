"""Training metrics in the store: where a flow task tells its trainer to write them, and how they are read.

A task of a flow exports `task_env(...)` to its children (torchrun's workers inherit it); rank 0 of the trainer
(`stoker.train.metrics.MetricsWriter`) then streams every metrics record into the series

    runs/<flow>/<run>/metrics/<step>/<task>/<attempt>/         (stoker.store.series)

and copies its TensorBoard event files to `runs/<flow>/<run>/tensorboard/<step>/<task>/<attempt>/`. Readers:

    task_metrics(db, store, flow, run_id, step, task_id)   every attempt of one task, oldest first
    run_metrics(db, store, flow, run_id)                   every task of a run
    metrics_frame(records)                                 the same as a pandas DataFrame

A retry is a new attempt with its own series; every record carries its "attempt" and "run_id". A task of a
resumed run continues the curve of the run it resumed: its records are preceded by the origin task's records
of the steps before its own first step; a task cloned by `resume` shows its origin's records.
"""

from __future__ import annotations

from typing import Any

from stoker.store.blobs import BlobStore
from stoker.store.manifest import run_prefix
from stoker.store.metadata import MetadataDB
from stoker.store.series import read_series, series_prefix

ENV_STORE = "STOKER_METRICS_STORE"  # the store URL the trainer writes its metrics to
ENV_PREFIX = "STOKER_METRICS_PREFIX"  # the series prefix of this task attempt's metrics
ENV_TENSORBOARD = "STOKER_TENSORBOARD_PREFIX"  # where this attempt's TensorBoard event files go in the store
ENV_INTERVAL = "STOKER_METRICS_INTERVAL"  # seconds between uploads (default 5)

_MAX_ORIGIN_DEPTH = 50  # resumes of resumes; a cycle cannot happen but must not hang a reader either


def tensorboard_prefix(flow: str, run_id: str, step: str, task_id: str, attempt: int) -> str:
    """`runs/<flow>/<run>/tensorboard/<step>/<task>/<attempt>/`: `tensorboard --logdir runs/<flow>/<run>` on a
    local store shows every task's curves."""
    return f"{run_prefix(flow, run_id)}tensorboard/{step}/{task_id}/{int(attempt)}/"


def task_env(store_url: str, flow: str, run_id: str, step: str, task_id: str, attempt: int) -> dict[str, str]:
    """The variables a flow task exports so the trainer in its (torchrun) children streams metrics to the store."""
    return {ENV_STORE: store_url,
            ENV_PREFIX: series_prefix("metrics", flow, run_id, step, task_id, attempt),
            ENV_TENSORBOARD: tensorboard_prefix(flow, run_id, step, task_id, attempt)}


def attempt_records(store: BlobStore, flow: str, run_id: str, step: str, task_id: str) -> list[dict[str, Any]]:
    """This run's records of one task, every attempt in order, each with "attempt" and "run_id" added. Reads the
    store only, so a task still running (or one the index has not seen yet) shows what it uploaded so far."""
    base = f"{run_prefix(flow, run_id)}metrics/{step}/{task_id}/"
    attempts = sorted({int(a) for a in (n[len(base):].split("/", 1)[0] for n in store.list(base)) if a.isdigit()})
    out: list[dict[str, Any]] = []
    for attempt in attempts:
        for record in read_series(store, series_prefix("metrics", flow, run_id, step, task_id, attempt)):
            out.append({**record, "attempt": attempt, "run_id": run_id})
    return out


def task_metrics(db: MetadataDB, store: BlobStore, flow: str, run_id: str, step: str, task_id: str,
                 _depth: int = 0) -> list[dict[str, Any]]:
    """Every metrics record of a task (all attempts, oldest first), continued from the run it resumed."""
    origin = _cloned_from(db, flow, run_id, step, task_id)
    if origin is not None:  # cloned by resume: it did not run here, its origin's curve is its curve
        o_flow, o_run, o_step, o_task = origin.split("/")
        return task_metrics(db, store, o_flow, o_run, o_step, o_task, _depth + 1) if _depth < _MAX_ORIGIN_DEPTH else []
    own = attempt_records(store, flow, run_id, step, task_id)
    run = db.get_run(flow, run_id)
    if run is None or not run.origin_run_id or _depth >= _MAX_ORIGIN_DEPTH:
        return own
    before = _origin_task(db, flow, run.origin_run_id, step, run_id, task_id)
    if before is None:
        return own
    older = task_metrics(db, store, flow, run.origin_run_id, step, before, _depth + 1)
    steps = [r["step"] for r in own if isinstance(r.get("step"), int)]
    if steps:  # the new run took over at its first step: the old run's records from there on are superseded
        older = [r for r in older if isinstance(r.get("step"), int) and r["step"] < min(steps)]
    return older + own


def run_metrics(db: MetadataDB, store: BlobStore, flow: str, run_id: str) -> list[dict[str, Any]]:
    """Every task's records in the order the steps started, each with "step_name" and "task_id"."""
    out: list[dict[str, Any]] = []
    for step in db.list_steps(flow, run_id):
        for task in db.list_tasks(flow, run_id, step.step):
            out.extend({**r, "step_name": step.step, "task_id": task.task_id}
                       for r in task_metrics(db, store, flow, run_id, step.step, task.task_id))
    return out


def metrics_frame(records: list[dict[str, Any]]) -> Any:
    """The records as a pandas DataFrame (one row per record; the columns are the union of the keys)."""
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("metrics as a DataFrame need pandas: pip install pandas (or use .metrics, a list of "
                          "dicts)") from None
    return pd.DataFrame.from_records(records)


def _cloned_from(db: MetadataDB, flow: str, run_id: str, step: str, task_id: str) -> str | None:
    task = db.get_task(flow, run_id, step, task_id)
    if task is None:
        return None
    attempt = db.get_attempt(flow, run_id, step, task_id, task.attempt)
    manifest = attempt.manifest if attempt is not None else None
    origin = (manifest or {}).get("origin_task")
    return origin if isinstance(origin, str) and origin.count("/") == 3 else None


def _origin_task(db: MetadataDB, flow: str, origin_run: str, step: str, run_id: str, task_id: str) -> str | None:
    """The task of the origin run at the same place as this one: same step, same foreach position (and, in a
    gang, the same rank among the step's tasks at that position)."""
    task = db.get_task(flow, run_id, step, task_id)
    if task is None:
        return None
    mine = [t.task_id for t in db.list_tasks(flow, run_id, step) if t.foreach_index == task.foreach_index]
    theirs = [t.task_id for t in db.list_tasks(flow, origin_run, step) if t.foreach_index == task.foreach_index]
    pos = mine.index(task_id)
    return theirs[pos] if pos < len(theirs) else None
