"""The goodput ledger the run page draws (stoker.client.goodput.run_goodput, priced as `stoker goodput` prices it)
and the labels of its categories and of the failure causes.

A finished run's ledger never changes: it is computed once and kept. A running run's is computed at most every
:data:`LIVE_TTL_S` seconds, however many pages poll it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from stoker.client.goodput import LABELS
from stoker.runtime.driver.causes import LABELS as CAUSE_LABELS
from stoker.store.blobs import BlobStore

LIVE_TTL_S = 3.0  # a running run's ledger is recomputed at most this often
MAX_KEPT = 64  # finished runs' ledgers kept


def cause_label(kind: str | None) -> str | None:
    return CAUSE_LABELS.get(kind, kind) if kind else None


def _compute(store: BlobStore, flow: str, run_id: str) -> dict[str, Any]:
    from stoker.backends.aws.instances import price_per_hour
    from stoker.client.goodput import run_goodput

    try:
        doc = run_goodput(store, flow, run_id, price=price_per_hour)
    except Exception as e:  # noqa: BLE001 - unreadable records: the page says so instead of failing
        return {"goodput": None, "error": f"{type(e).__name__}: {e}", "labels": LABELS, "causes": CAUSE_LABELS}
    # a run without a training step has no ledger to draw
    return {"goodput": doc if doc["steps"] else None, "error": None, "labels": LABELS, "causes": CAUSE_LABELS}


class LedgerCache:
    """The ledgers the UI served: a finished run's for good (up to :data:`MAX_KEPT`), a running run's for
    :data:`LIVE_TTL_S` seconds."""

    def __init__(self, store: BlobStore, clock: Any = time.monotonic) -> None:
        self.store, self.clock = store, clock
        self._kept: dict[tuple[str, str], tuple[float | None, dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def ledger(self, flow: str, run_id: str, *, finished: bool) -> dict[str, Any]:
        key = (flow, run_id)
        now = self.clock()
        with self._lock:
            hit = self._kept.get(key)
        if hit is not None and (hit[0] is None or now < hit[0]):
            return hit[1]
        out = _compute(self.store, flow, run_id)
        with self._lock:
            if key not in self._kept and len(self._kept) >= MAX_KEPT:
                self._kept.pop(next(iter(self._kept)))  # the oldest
            self._kept[key] = (None if finished and out["error"] is None else now + LIVE_TTL_S, out)
        return out
