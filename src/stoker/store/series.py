"""Time series in the store: training metrics and monitor samples, appended while a task runs.

A series is a folder of chunk objects, `<prefix><seq:06d>.jsonl.gz` (gzip of one JSON object per line; plain
`.jsonl` chunks are read too): monitor samples compress about tenfold, so a week at one sample a second stays
tens of MB per node. A writer buffers
records and writes a new chunk every `interval` seconds (and when closed), so the data lands while the task
runs, on a local folder or S3 alike, and a reader concatenates the chunks in order. A chunk is written once
and never changed, so readers never see half a line; a writer that dies loses at most its last interval.

    runs/<flow>/<run>/metrics/<step>/<task>/<attempt>/      training metrics (rank 0 of the trainer)
    runs/<flow>/<run>/monitor/<step>/<task>/<attempt>/<node>/  @monitor samples (one series per node)
"""

from __future__ import annotations

import gzip
import json
import math
import threading
import time
from collections.abc import Iterator
from typing import Any

from stoker.store.blobs import BlobStore
from stoker.store.manifest import run_prefix

KINDS = ("metrics", "monitor")
SUFFIXES = (".jsonl.gz", ".jsonl")


def chunk_seq(name: str, prefix: str) -> int | None:
    """The sequence number of chunk `name` directly under `prefix` (None: not one of its chunks)."""
    rest = name[len(prefix):] if name.startswith(prefix) else ""
    for suffix in SUFFIXES:
        if rest.endswith(suffix) and rest[: -len(suffix)].isdigit():
            return int(rest[: -len(suffix)])
    return None


def decode_chunk(name: str, data: bytes) -> list[dict[str, Any]]:
    """The records of one chunk (a line torn by a crashed writer is skipped)."""
    if name.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError):
            return []
    out = []
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def series_prefix(kind: str, flow: str, run_id: str, step: str, task_id: str, attempt: int,
                  node: int | None = None) -> str:
    """Where one task attempt's series of `kind` lives (monitor: one per node)."""
    if kind not in KINDS:
        raise ValueError(f"unknown series kind {kind!r}: one of {', '.join(KINDS)}")
    base = f"{run_prefix(flow, run_id)}{kind}/{step}/{task_id}/{attempt}/"
    return base if node is None else f"{base}{int(node)}/"


def _clean(record: dict[str, Any]) -> dict[str, Any]:
    """JSON has no NaN or infinity: they become null."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}


class SeriesWriter:
    """Appends records to a series: `add(record)` is cheap (a list append); a background thread writes a chunk
    every `interval` seconds when there is something new; `close()` writes the rest. Upload errors are kept
    for the next try and never raised into the caller (a metric must not fail training)."""

    def __init__(self, store: BlobStore, prefix: str, interval: float = 5.0, start_seq: int | None = None) -> None:
        self.store, self.prefix, self.interval = store, prefix, interval
        self.seq = start_seq if start_seq is not None else _next_seq(store, prefix)
        self.pending: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"series {prefix}")
        self._thread.start()

    def add(self, record: dict[str, Any]) -> None:
        record = _clean(record)
        record.setdefault("time", time.time())
        with self.lock:
            self.pending.append(record)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.flush()

    def flush(self) -> bool:
        """Write what is pending as one chunk; False when the store refused it (kept for the next try)."""
        with self.lock:
            batch, self.pending = self.pending, []
        if not batch:
            return True
        data = gzip.compress("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in batch).encode(), mtime=0)
        try:
            self.store.write(f"{self.prefix}{self.seq:06d}.jsonl.gz", data, durable=False)
        except Exception:  # noqa: BLE001 - best effort: retried with the next chunk
            self.errors += 1
            with self.lock:
                self.pending = batch + self.pending
            return False
        self.seq += 1
        return True

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval + 5)
        self.flush()


def _next_seq(store: BlobStore, prefix: str) -> int:
    """A writer that resumes a series (the same attempt written again) goes on after its last chunk."""
    return 1 + max((n for n in (chunk_seq(name, prefix) for name in store.list(prefix)) if n is not None), default=0)


def read_series(store: BlobStore, prefix: str) -> list[dict[str, Any]]:
    """Every record of the series at `prefix` (its own chunks only, not those of sub-series), in order."""
    return list(iter_series(store, prefix))


def iter_series(store: BlobStore, prefix: str) -> Iterator[dict[str, Any]]:
    chunks = sorted((seq, name) for name in store.list(prefix) if (seq := chunk_seq(name, prefix)) is not None)
    for _, name in chunks:
        yield from decode_chunk(name, store.read(name))
