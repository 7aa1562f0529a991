"""Content hashing shared by every layer (blobs, dataset shards, tokenizer fingerprints): the one file hasher
(:func:`sha256_file`, :func:`file_key`), the content keys of blobs (:func:`content_key`), and a stream hasher that
runs beside its writer (:class:`PipelinedHash`).

A content key names its hash: 64 hex digits are a sha256 (every blob stored before BLAKE3, and the blobs whose
key other code recomputes with sha256, such as the Neuron cache's), ``b3-`` and 64 hex digits a BLAKE3 (the
blobs of artifacts: ~2.5x sha256's speed on one core). Both stay readable; :func:`key_algo` tells which a key uses.

Every hash here runs on the calling thread (BLAKE3 with one thread, never its ``AUTO`` pool): stoker's processes
fork (the driver, the fork server, the node agent, the warm launcher), and a native thread pool started before a
``fork()`` does not exist in the child, whose first large hash would then wait for it forever.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import queue
import re
import threading
from typing import Any

CHUNK = 8 << 20
SHA256, BLAKE3 = "sha256", "blake3"
B3_PREFIX = "b3-"
_HEX64 = re.compile(r"[0-9a-f]{64}")


def sha256_file(path: str | os.PathLike, chunk: int = CHUNK) -> str:
    """The sha256 hex digest of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for data in iter(lambda: f.read(chunk), b""):
            h.update(data)
    return h.hexdigest()


def key_algo(key: object) -> str | None:
    """The hash a content key names (:data:`SHA256` or :data:`BLAKE3`), None when ``key`` is not one."""
    if not isinstance(key, str):
        return None
    if len(key) == 64 and _HEX64.fullmatch(key):
        return SHA256
    if key.startswith(B3_PREFIX) and len(key) == 67 and _HEX64.fullmatch(key, 3):
        return BLAKE3
    return None


def preferred_algo() -> str:
    """The hash of new artifact blobs: BLAKE3 where its package is installed (a dependency of stoker), else sha256."""
    try:
        import blake3  # noqa: F401
    except ImportError:
        return SHA256
    return BLAKE3


def new_hash(algo: str) -> Any:
    """A hashlib-like object (``update``, ``hexdigest``) of ``algo``, single-threaded (safe across ``fork()``).
    ImportError (with the fix) when BLAKE3 is asked for and its package is missing."""
    if algo == SHA256:
        return hashlib.sha256()
    if algo != BLAKE3:
        raise ValueError(f"unknown content hash {algo!r}")
    try:
        import blake3
    except ImportError as e:
        raise ImportError("this blob is addressed by its BLAKE3 hash (key b3-...): pip install blake3") from e
    return blake3.blake3()  # max_threads=1: no pool that a fork() would leave dead in the child


def key_of(algo: str, hexdigest: str) -> str:
    """The content key of a digest: the sha256 hex digest itself, or ``b3-`` and the BLAKE3 one."""
    return B3_PREFIX + hexdigest if algo == BLAKE3 else hexdigest


def content_key(data: Any, algo: str) -> str:
    """The content key of ``data`` (bytes, a memoryview, or any contiguous buffer such as a numpy array or a
    memory map: hashed where it lies, no copy) under ``algo``."""
    h = new_hash(algo)
    h.update(data if isinstance(data, bytes | bytearray) else memoryview(data).cast("B"))
    return key_of(algo, h.hexdigest())


def file_key(path: str | os.PathLike, algo: str) -> str:
    """The content key of a file under ``algo``, read through a memory map (its pages are the page cache's, which
    a later memory map of the same file then finds)."""
    h = new_hash(algo)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size:
            with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as m:
                if hasattr(mmap, "MADV_SEQUENTIAL"):
                    m.madvise(mmap.MADV_SEQUENTIAL)
                view = memoryview(m)
                try:
                    h.update(view)
                finally:
                    view.release()
    return key_of(algo, h.hexdigest())


class PipelinedHash:
    """A hash (sha256 unless ``algo`` says otherwise) computed on a helper thread while the caller writes the same
    chunks (both release the GIL), so hashing a large array overlaps with copying it into the page cache. Small
    streams (one chunk) are hashed inline. Call :meth:`hexdigest` (or :meth:`key`) at the end, or :meth:`close`
    to give up."""

    def __init__(self, algo: str = SHA256) -> None:
        self.algo = algo
        self._h = new_hash(algo)
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

    def key(self) -> str:
        """The content key of what was written (:func:`key_of` the digest)."""
        return key_of(self.algo, self.hexdigest())
