"""Content hashing shared by every layer (blobs, dataset shards, tokenizer fingerprints): the one file hasher
(:func:`sha256_file`) and a stream hasher that runs beside its writer (:class:`PipelinedHash`)."""

from __future__ import annotations

import hashlib
import os
import queue
import threading

CHUNK = 8 << 20


def sha256_file(path: str | os.PathLike, chunk: int = CHUNK) -> str:
    """The sha256 hex digest of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for data in iter(lambda: f.read(chunk), b""):
            h.update(data)
    return h.hexdigest()


class PipelinedHash:
    """sha256 computed on a helper thread while the caller writes the same chunks (both release the GIL), so
    hashing a large array overlaps with copying it into the page cache. Small streams (one chunk) are hashed
    inline. Call :meth:`hexdigest` at the end, or :meth:`close` to give up."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()
        self._first: bytes | memoryview | None = None
        self._queue: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def update(self, chunk: bytes | memoryview) -> None:
        if self._first is None and self._queue is None:
            self._first = chunk  # wait: a single chunk is hashed inline
            return
        if self._queue is None:
            self._queue = queue.Queue(maxsize=4)
            self._thread = threading.Thread(target=self._run, name="stoker-hash", daemon=True)
            self._thread.start()
            self._queue.put(self._first)
            self._first = None
        self._queue.put(chunk)

    def _run(self) -> None:
        assert self._queue is not None
        while (chunk := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self._h.update(chunk)
                except BaseException as e:  # reported by hexdigest; keep draining so put() never blocks
                    self._error = e

    def close(self) -> None:
        if self._queue is not None and self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._queue = None

    def hexdigest(self) -> str:
        if self._first is not None:
            self._h.update(self._first)
            self._first = None
        self.close()
        if self._error is not None:
            raise self._error
        return self._h.hexdigest()
