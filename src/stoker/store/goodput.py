"""What the goodput ledger (stoker.client.goodput) reads from the store, and the two small recorders that put it there.

Phase timings. A task attempt's start-up phases (the code package a remote node unpacks, inputs staged to the node,
the preflight, the Neuron compile cache, the pre-compilation pass) are timed where they happen, with
:func:`timed` (or :func:`record`), into this process's table; the task takes it (:func:`take_timings`) into its
manifest's ``timings`` (phase -> seconds). A remote node's agent and its task are one process, so the node's
phases land in the same manifest. Where each phase sits in the attempt is fixed by its name (:data:`PHASES`):
``node`` phases run before the task starts (before the manifest's ``started_at``), ``start`` phases between the
task's start and the trainer's, ``end`` phases after the trainer.

The trainer's ledger. Local rank 0 of every node of a training step (stoker.train.ledger) appends a cumulative
snapshot to the series ``<metrics prefix>ledger/`` of its task attempt (a series of its own next to the training
metrics, ``runs/<flow>/<run>/metrics/<step>/<task>/<attempt>/ledger/``, so the metrics records stay one per
logged step) at every log window and when it ends; the latest one is what the attempt measured.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from stoker.store.blobs import BlobStore
from stoker.store.series import iter_series, series_prefix

# phase -> where it sits in an attempt: "node" (the remote node's agent, before the task starts), "start" (in the
# task, before the training command), "end" (after it)
PHASES: dict[str, str] = {
    "node_setup": "node",  # the node agent: the store opened, the unit spec read, the node's environment
    "code_package": "node",  # the code package fetched from the store and unpacked
    "stage": "start",  # inputs copied to the node's disk (@torchrun(stage=...))
    "neuron_cache_fetch": "start",  # the Neuron compile cache fetched from the store
    "preflight": "start",  # the gang's node checks (devices, EFA, disk, an all_reduce)
    "precompile": "start",  # neuron_parallel_compile's pass (and its cache upload)
    "neuron_cache_upload": "end",  # the Neuron compile cache uploaded after training
}

LEDGER_SERIES = "ledger/"  # the trainer's ledger: a series under its attempt's metrics prefix
LEDGER_VERSION = 1
# the trainer's activities: they partition the time since its ledger was made (stoker.train.ledger)
ACTIVITIES = ("init", "checkpoint_load", "steps", "checkpoint_save", "eval")

_lock = threading.Lock()
_timings: dict[str, float] = {}


def record(phase: str, seconds: float) -> None:
    """Add ``seconds`` to ``phase`` of this process's attempt (a phase that runs twice adds up)."""
    with _lock:
        _timings[phase] = _timings.get(phase, 0.0) + max(0.0, float(seconds))


@contextmanager
def timed(phase: str) -> Iterator[None]:
    """Time the block as ``phase`` (also when it raises: a failed phase took its time too)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        record(phase, time.perf_counter() - start)


def take_timings() -> dict[str, float] | None:
    """This process's phase timings, rounded to ms, and the table emptied (None when nothing was timed)."""
    with _lock:
        out = {k: round(v, 3) for k, v in _timings.items()}
        _timings.clear()
    return out or None


def ledger_prefix(flow: str, run_id: str, step: str, task_id: str, attempt: int) -> str:
    """Where the trainer's ledger of one task attempt is kept."""
    return series_prefix("metrics", flow, run_id, step, task_id, attempt) + LEDGER_SERIES


def latest_snapshot(store: BlobStore, flow: str, run_id: str, step: str, task_id: str,
                    attempt: int) -> dict[str, Any] | None:
    """The last ledger snapshot the trainer of this attempt wrote (None: it wrote none)."""
    last = None
    for rec in iter_series(store, ledger_prefix(flow, run_id, step, task_id, attempt)):
        if rec.get("kind") == "ledger":
            last = rec
    return last


def ledger_segments(store: BlobStore, flow: str, run_id: str, step: str, task_id: str,
                    attempt: int) -> list[dict[str, Any]]:
    """The last snapshot of each trainer process that wrote this attempt's ledger, oldest first. One attempt has
    several when a gang with hot spares moved to a new generation: its torchrun (and trainer) started again, on
    the survivors and on the spare that took a lost node's slot, appending to the same series."""
    last: dict[float, dict[str, Any]] = {}
    for rec in iter_series(store, ledger_prefix(flow, run_id, step, task_id, attempt)):
        created = rec.get("created_at")
        if rec.get("kind") == "ledger" and isinstance(created, (int, float)):
            last[float(created)] = rec
    return [last[k] for k in sorted(last)]
