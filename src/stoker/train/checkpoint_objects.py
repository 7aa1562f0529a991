"""torch.distributed.checkpoint (DCP) straight to object storage, through :mod:`stoker.store.objects`.

:class:`ObjectWriter` and :class:`ObjectReader` are DCP's own FileSystemWriter / FileSystemReader with their
file system swapped for :class:`ObjectFileSystem`: every rank streams its shard file into a multipart upload
(parts sent in parallel while DCP keeps serializing; memory stays at ``concurrency`` parts), hashing it as it
goes, so the commit needs no second read of what was written (:attr:`ObjectWriter.digests`). Nothing is
renamed but the small ``.metadata`` (written as ``.metadata.tmp`` by DCP, then copied).

Reading downloads each shard file whole, in parallel ranged GETs, a few files ahead of the one DCP is reading,
and checks its sha256 against the manifest before DCP sees a byte of it: a corrupted shard is refused.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import threading
from collections.abc import Generator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from torch.distributed.checkpoint.filesystem import FileSystemBase, FileSystemReader, FileSystemWriter

from stoker.errors import CheckpointError
from stoker.store.objects import ObjectStore

log = logging.getLogger("stoker.train.checkpoint")

PREFETCH_FILES = 2  # shard files downloaded ahead of the one being read (memory: that many files)


class BufferStream(io.RawIOBase):
    """A read-only, seekable stream over a buffer, without copying it (io.BytesIO copies anything but bytes);
    closing it lets go of the buffer (a downloaded shard is freed once DCP has read it)."""

    def __init__(self, buffer: bytes | memoryview) -> None:
        super().__init__()
        self._view: memoryview | None = memoryview(buffer).cast("B")
        self._pos = 0

    def _buf(self) -> memoryview:
        if self._view is None:
            raise ValueError("I/O operation on closed stream")
        return self._view

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._buf())}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def readinto(self, b: Any) -> int:
        view = self._buf()
        out = memoryview(b).cast("B")
        n = max(0, min(out.nbytes, view.nbytes - self._pos))
        out[:n] = view[self._pos:self._pos + n]
        self._pos += n
        return n

    def read(self, size: int | None = -1) -> bytes:
        view = self._buf()
        end = view.nbytes if size is None or size < 0 else min(view.nbytes, self._pos + size)
        data = bytes(view[self._pos:end]) if end > self._pos else b""
        self._pos = max(self._pos, end)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def close(self) -> None:
        if self._view is not None:
            with contextlib.suppress(BufferError):  # a reader still holds a view of it: freed with that
                self._view.release()
            self._view = None
        super().close()


class ObjectFileSystem(FileSystemBase):
    """DCP's file-system calls on an object store; paths are keys relative to the store's root."""

    def __init__(self, objects: ObjectStore, expected: dict[str, dict[str, Any]] | None = None,
                 root: str = "") -> None:
        self.objects = objects
        self.expected = expected or {}  # checkpoint-relative path -> {sha256, bytes} (from the manifest)
        self.root = root.strip("/")
        self.digests: dict[str, dict[str, Any]] = {}  # what this process wrote: relative path -> {sha256, bytes}
        self._lock = threading.Lock()
        self._prefetched: dict[str, Future] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._slots = threading.Semaphore(PREFETCH_FILES)
        self._closing = False

    def _rel(self, path: str | os.PathLike) -> str:
        key = str(path)
        return key[len(self.root) + 1:] if self.root and key.startswith(self.root + "/") else key

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[io.IOBase, None, None]:
        key = str(path)
        if "w" in mode:
            with self.objects.open_write(key) as upload:
                yield upload  # type: ignore[misc]
            with self._lock:
                self.digests[self._rel(key)] = {"sha256": upload.sha256, "bytes": upload.size}
            return
        future = self._prefetched.pop(key, None)
        if future is None:
            data = self._fetch(key)
        else:
            try:
                data = future.result()
            finally:
                self._slots.release()  # its memory is the reader's now: the next file may come down
            del future  # (it holds the result too)
        with BufferStream(data) as stream:
            del data  # the stream holds the only reference: closing it frees the shard
            yield stream

    def _fetch(self, key: str) -> bytes | memoryview:
        """Object ``key``, checked against its recorded sha256 (CheckpointError if it does not match)."""
        meta = self.expected.get(self._rel(key)) or {}
        try:  # the size is checked after the first GET, the sha256 while the parts land
            return self.objects.get_buffer(key, sha256=meta.get("sha256"), size=meta.get("bytes"))
        except CheckpointError as e:
            url = self.objects.url_of(key)
            if "is corrupted" in str(e):
                raise CheckpointError(f"{url} does not match its checksum in manifest.json: the checkpoint is "
                                      "corrupted; use an earlier one") from None
            if "its record says" in str(e):  # "<url> has N bytes, its record says M: ..."
                sizes = str(e).split(": it is truncated")[0].replace("its record says", "its manifest says")
                raise CheckpointError(f"{sizes}: the checkpoint is truncated or corrupted; "
                                      "use an earlier one") from None
            raise

    def prefetch(self, keys: list[str]) -> None:
        """Start downloading ``keys`` in order, at most PREFETCH_FILES ahead of the reader."""
        if len(keys) < 2:
            return
        self._slots = threading.Semaphore(PREFETCH_FILES)
        self._pool = self._pool or ThreadPoolExecutor(1, thread_name_prefix="stoker-ckpt-read")

        def one(key: str) -> bytes | memoryview:
            self._slots.acquire()  # released once the reader took the file: at most PREFETCH_FILES held
            return b"" if self._closing else self._fetch(key)

        for key in keys:
            self._prefetched[key] = self._pool.submit(one, key)

    def close(self) -> None:
        """Stop prefetching (a read that failed half way leaves files nobody will read)."""
        self._closing = True
        for f in self._prefetched.values():
            f.cancel()
            self._slots.release()  # wakes a worker waiting for a slot, so it can see it is closing
        self._prefetched.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._closing = False

    def concat_path(self, path: str | os.PathLike, suffix: str) -> str:
        return f"{str(path).rstrip('/')}/{suffix}" if str(path) else suffix

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        """Only DCP's ``.metadata.tmp`` -> ``.metadata`` (small): a copy, then the old object deleted."""
        self.objects.put_bytes(str(new_path), self.objects.get_bytes(str(path)))
        self.objects.delete(str(path))
        with self._lock:
            if (meta := self.digests.pop(self._rel(path), None)) is not None:
                self.digests[self._rel(new_path)] = meta

    def init_path(self, path: str | os.PathLike) -> str:
        return str(path).strip("/")

    def mkdir(self, path: str | os.PathLike) -> None:
        """Object stores have no folders."""

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return False  # chosen explicitly, never by DCP's guess from a path

    def exists(self, path: str | os.PathLike) -> bool:
        return self.objects.exists(str(path))

    def rm_file(self, path: str | os.PathLike) -> None:
        self.objects.delete(str(path))

    def ls(self, path: str | os.PathLike) -> list[str]:
        prefix = f"{str(path).rstrip('/')}/"
        return [o.key for o in self.objects.list(prefix)]


class ObjectWriter(FileSystemWriter):
    """DCP writer of checkpoint ``name`` (a key prefix) in ``objects``; :attr:`digests` afterwards holds the
    {relative path: {sha256, bytes}} of every file this rank wrote."""

    def __init__(self, objects: ObjectStore, name: str, *, thread_count: int = 1) -> None:
        super().__init__(name, sync_files=False, thread_count=thread_count)
        self.fs = ObjectFileSystem(objects, root=name)
        self.path = name.strip("/")

    @property
    def digests(self) -> dict[str, dict[str, Any]]:
        return dict(self.fs.digests)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return False


class ObjectReader(FileSystemReader):
    """DCP reader of checkpoint ``name`` in ``objects``; ``files`` is its manifest's {relative path: {sha256,
    bytes}}: every file read is checked against it."""

    def __init__(self, objects: ObjectStore, name: str, files: dict[str, dict[str, Any]]) -> None:
        super().__init__(name)
        self.fs = ObjectFileSystem(objects, expected=files, root=name)
        self.path = name.strip("/")

    def read_data(self, plan: Any, planner: Any) -> Future[None]:
        needed: list[str] = []
        for item in plan.items:
            rel = self.storage_data[item.storage_index].relative_path
            key = self.fs.concat_path(self.path, rel)
            if key not in needed:
                needed.append(key)  # the order DCP reads them in (first use)
        self.fs.prefetch(needed)  # shard files come down while DCP deserializes the one before
        try:
            return super().read_data(plan, planner)
        finally:
            self.fs.close()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return False
