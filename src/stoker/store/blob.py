"""The blob store: content-addressed immutable blobs plus named, atomically replaced objects.

Layout of a store root (a local folder, or ``s3://bucket/prefix``)::

    blobs/<key[:2]>/<key>     immutable blobs, key = sha256 of the content (deduplicated)
    <name>                    named objects, e.g. runs/<flow>/<run>/<step>/<task>/<attempt>/manifest.json
    .tmp/                     staging area of a local store (same file system, so rename is atomic)

Every write is atomic: readers see the old content or the new one, never a torn file.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import queue
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path

from stoker.errors import StoreError
from stoker.store.blob_base import (  # noqa: F401  (re-exported: the blob store's public names live here)
    _RESERVED,
    CHUNK,
    BlobStore,
    check_key,
    check_name,
    file_chunks,
    hash_file,
)
from stoker.store.paths import default_store_url

log = logging.getLogger(__name__)



class LocalBlobStore(BlobStore):
    """A blob store in a local folder (the default: ``$STOKER_HOME/store``).

    Blobs are written to ``.tmp/``, fsynced, renamed into place and made read-only, and their folder is
    fsynced after the rename: a put returns only once the blob would survive a power cut, so a manifest
    written after it never names a missing or torn blob. A put that finds the blob already there checks
    its size and rewrites a torn one (``verify_blob`` re-hashes). ``fsync_blobs=False`` skips both fsyncs
    (for scratch stores whose content may be lost). Named objects (manifests, pointers) are fsynced
    before the rename unless written with ``durable=False``; their folder is not fsynced (it costs 3x
    the file's fsync here): after a power cut a just-renamed object may be missing, never torn.
    """

    def __init__(self, root: str | os.PathLike, *, fsync_blobs: bool = True) -> None:
        self.root = Path(root).expanduser().resolve()
        self.url = str(self.root)
        self.fsync_blobs = fsync_blobs
        self._blobs = self.root / "blobs"
        self._tmp = self.root / ".tmp"
        try:
            self._blobs.mkdir(parents=True, exist_ok=True)
            self._tmp.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create the blob store at {self.root}: {e}; set STOKER_HOME or "
                             f"STOKER_STORE to a writable folder") from e

    # --- helpers -----------------------------------------------------------------------------------
    def _blob_file(self, key: str) -> Path:
        check_key(key)
        return self._blobs / key[:2] / key

    def _tempfile(self) -> tuple[int, str]:
        return tempfile.mkstemp(dir=self._tmp, prefix="put-")

    def _have_blob(self, dest: Path, size: int) -> bool:
        """Whether blob file ``dest`` exists with ``size`` bytes. One of another size was torn (a power cut
        before blobs were fsynced, a full disk, a bad copy): it is reported, and the caller rewrites it."""
        try:
            found = dest.stat().st_size
        except FileNotFoundError:
            return False
        if found == size:
            return True
        log.warning("blob %s in %s has %d bytes instead of %d (torn by a crash or a bad copy): rewriting it",
                    dest.name, self.url, found, size)
        return False

    def _sync_dir(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _place(self, src: str | os.PathLike, dest: Path) -> None:
        """Rename the (fsynced, read-only) file ``src`` to the blob file ``dest`` and make the rename durable."""
        try:
            dest.parent.mkdir()
            new_folder = True
        except FileExistsError:
            new_folder = False
        os.replace(src, dest)  # replaces a torn blob too: renaming needs no write access to the old file
        if self.fsync_blobs:
            self._sync_dir(dest.parent)
            if new_folder:
                self._sync_dir(self._blobs)

    def _commit_blob(self, tmp: str, key: str, size: int) -> None:
        """Rename a fully written temp file to blob ``key`` (or drop it if the blob already exists)."""
        dest = self._blob_file(key)
        if self._have_blob(dest, size):
            os.unlink(tmp)
            return
        os.chmod(tmp, 0o444)  # blobs are immutable; numpy may map them
        self._place(tmp, dest)

    def _write_failed(self, e: OSError) -> StoreError:
        fix = ("free space on its file system or point STOKER_STORE elsewhere" if e.errno in (errno.ENOSPC, errno.EDQUOT)
               else "check that the folder is writable and its disk healthy")
        return StoreError(f"cannot write a blob to the store {self.url}: {e}; {fix}")

    # --- blobs -------------------------------------------------------------------------------------
    def put_bytes(self, data: bytes | memoryview) -> str:
        key = hashlib.sha256(data).hexdigest()
        if not self._have_blob(self._blob_file(key), memoryview(data).nbytes):
            self._write_tmp_and_commit([data], key)
        return key

    def put_stream(self, chunks: Iterable[bytes | memoryview]) -> str:
        return self._write_tmp_and_commit(chunks, None)

    def _write_tmp_and_commit(self, chunks: Iterable[bytes | memoryview], key: str | None) -> str:
        try:
            fd, tmp = self._tempfile()
        except OSError as e:
            raise self._write_failed(e) from e
        h = _PipelinedHash() if key is None else None
        size = 0
        try:
            with os.fdopen(fd, "wb", buffering=0) as f:
                for chunk in chunks:
                    if h is not None:
                        h.update(chunk)
                    view = memoryview(chunk).cast("B")
                    size += view.nbytes
                    try:
                        while view.nbytes:  # raw writes may be partial
                            n = f.write(view)
                            view = view[n:]
                    except OSError as e:
                        raise self._write_failed(e) from e
                if self.fsync_blobs:
                    try:
                        os.fsync(f.fileno())  # the content is on disk before the name points at it
                    except OSError as e:
                        raise self._write_failed(e) from e
            key = key if h is None else h.hexdigest()
            try:
                self._commit_blob(tmp, key, size)
            except OSError as e:
                raise self._write_failed(e) from e
        except BaseException:
            if h is not None:
                h.close()
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return key

    def put_file(self, path: str | os.PathLike, move: bool = False) -> str:
        path = Path(path)
        if not path.is_file():
            raise StoreError(f"cannot store {path}: not a file")
        if not move:
            return self.put_stream(file_chunks(path))
        key = hash_file(path)
        dest = self._blob_file(key)
        if self._have_blob(dest, path.stat().st_size):
            path.unlink()
            return key
        if path.stat().st_dev != self._tmp.stat().st_dev:  # another file system: copy, then remove the source
            self.put_stream(file_chunks(path))
            path.unlink()
            return key
        try:
            if self.fsync_blobs:
                fd = os.open(path, os.O_RDONLY)  # its writer may not have synced it
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            os.chmod(path, 0o444)
            self._place(path, dest)
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise self._write_failed(e) from e
            self.put_stream(file_chunks(path))  # another file system after all (a bind mount): copy
            path.unlink()
        return key

    def get_bytes(self, key: str) -> bytes:
        data = self.blob_path(key).read_bytes()
        if hashlib.sha256(data).hexdigest() != key:  # signed manifests and specs name blobs by content
            raise StoreError(f"blob {key} in {self.url} does not match its hash: it was corrupted or replaced "
                             f"after it was written; re-run the step that produced it")
        return data

    def blob_path(self, key: str) -> Path:
        path = self._blob_file(key)
        if not path.exists():
            raise StoreError(f"blob {key} is missing from the store {self.url} (was it garbage-collected, "
                             f"or is STOKER_STORE pointing at another store?)")
        return path

    def has_blob(self, key: str) -> bool:
        return self._blob_file(key).exists()

    # --- named objects -----------------------------------------------------------------------------
    def _object_file(self, name: str) -> Path:
        return self.root / check_name(name)

    def write(self, name: str, data: bytes, *, durable: bool = True) -> None:
        dest = self._object_file(name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = self._tempfile()
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
            os.chmod(tmp, 0o644)  # mkstemp makes 0600 files; objects are as readable as blobs
            os.replace(tmp, dest)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def read(self, name: str) -> bytes:
        path = self._object_file(name)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise StoreError(f"object {name!r} does not exist in the store {self.url}") from None

    def exists(self, name: str) -> bool:
        return self._object_file(name).is_file()

    def list(self, prefix: str = "") -> list[str]:
        if prefix:
            check_name(prefix.rstrip("/") or "x")
        base_rel = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        base = self.root / base_rel if base_rel else self.root
        out: list[str] = []
        for dirpath, dirnames, filenames in os.walk(base):
            rel = os.path.relpath(dirpath, self.root).replace(os.sep, "/")
            rel = "" if rel == "." else rel + "/"
            # descend only into folders that can hold matching names
            dirnames[:] = sorted(
                d for d in dirnames
                if not (rel == "" and d in _RESERVED)
                and ((rel + d + "/").startswith(prefix) or prefix.startswith(rel + d + "/"))
            )
            out.extend(rel + f for f in filenames if (rel + f).startswith(prefix))
        return sorted(out)

    def delete(self, name: str) -> None:
        try:
            self._object_file(name).unlink()
        except FileNotFoundError:
            pass

    def local_path(self, name: str) -> Path | None:
        return self._object_file(name)


class _PipelinedHash:
    """sha256 computed on a helper thread while the caller writes the same chunks (both release the
    GIL), so hashing a large array overlaps with copying it into the page cache. Small streams (one
    chunk) are hashed inline."""

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


def open_store(url: str | os.PathLike | None = None, **kwargs) -> BlobStore:
    """Open the blob store at ``url``: a folder, ``file://folder`` or ``s3://bucket/prefix``.

    ``None`` means :func:`stoker.store.paths.default_store_url` (``$STOKER_STORE`` or
    ``$STOKER_HOME/store``). Keyword arguments go to the store's constructor (e.g. ``client=`` for S3).
    """
    url = default_store_url() if url is None else os.fspath(url)
    if url.startswith("s3://"):
        from stoker.store.s3 import S3BlobStore

        return S3BlobStore.from_url(url, **kwargs)
    if url.startswith("file://"):
        url = url[len("file://"):]
    if "://" in url:
        raise StoreError(f"unsupported store URL {url!r}: use a folder path or s3://bucket/prefix")
    return LocalBlobStore(url, **kwargs)


def copy_blob(src: BlobStore, dst: BlobStore, key: str) -> None:
    """Copy blob ``key`` from one store to another (no-op if ``dst`` has it)."""
    if not dst.has_blob(key):
        got = dst.put_stream(file_chunks(src.blob_path(key)))
        if got != key:
            raise StoreError(f"blob {key} in {src.url} is corrupted (its content hashes to {got})")
