"""Content-addressed blobs and named objects over any object store (:mod:`stoker.store.objects`).

Layout of a store root (a local folder, or ``s3://bucket/prefix``)::

    blobs/<key[:2]>/<key>     immutable blobs, key = sha256 of the content (deduplicated)
    <name>                    named objects, e.g. runs/<flow>/<run>/<step>/<task>/<attempt>/manifest.json
    .tmp/                     staging area of a local store (same file system, so rename is atomic)

:class:`BlobStore` is the one implementation; it does no I/O of its own (the object store writes under a
temporary name and renames, uploads in parts, lists). What it adds is content addressing:

- a put returns the blob's key only once the blob is durable (a local store fsyncs the file and its
  folder), so a manifest written after it never names a missing or torn blob; a put that finds the blob
  already there checks its size and rewrites a torn one. Local blobs are read-only.
- nothing is returned unverified: :meth:`BlobStore.get_blob` hashes what it read; a remote store keeps
  downloaded blobs in a local cache (``$STOKER_HOME/cache``) so :meth:`BlobStore.blob_path` can hand numpy
  a real file: a download is hashed before it enters the cache, which records its size next to it
  (``<key>.size``); every later use checks that size (a copy without a record is hashed again), and a
  damaged copy is deleted and downloaded again.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from stoker._hashing import CHUNK, PipelinedHash, sha256_file
from stoker.errors import StoreError
from stoker.store.objects import LocalObjects, ObjectStore, S3Objects, TransferConfig
from stoker.store.paths import default_cache_dir, default_store_url

log = logging.getLogger(__name__)

_KEY_RE = re.compile(r"^[0-9a-f]{64}$")
_RESERVED = ("blobs", ".tmp")


def check_key(key: str) -> str:
    """Return ``key`` if it is a sha256 hex digest, else raise StoreError."""
    if not isinstance(key, str) or not _KEY_RE.match(key):
        raise StoreError(f"{key!r} is not a blob key (expected 64 lowercase hex digits of a sha256)")
    return key


def check_name(name: str) -> str:
    """Return ``name`` if it is a valid relative object name (``a/b/c.json``), else raise StoreError."""
    if not isinstance(name, str) or not name or name.startswith("/") or "\\" in name:
        raise StoreError(f"object name {name!r} must be a non-empty relative path like 'runs/Flow/1/x.json'")
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts) or parts[0] in _RESERVED:
        raise StoreError(
            f"object name {name!r} is invalid: no empty, '.' or '..' parts, and it must not start with "
            f"{' or '.join(repr(r + '/') for r in _RESERVED)} (reserved for blobs)"
        )
    return name


def file_chunks(path: str | os.PathLike, chunk: int = CHUNK) -> Iterator[bytes]:
    """Yield the content of a file in chunks of ``chunk`` bytes."""
    with open(path, "rb") as f:
        while data := f.read(chunk):
            yield data


def blob_key_of(key: str) -> str:
    """The object key of blob ``key`` relative to the store's root."""
    check_key(key)
    return f"blobs/{key[:2]}/{key}"


class _CorruptBlob(StoreError):
    """A blob whose stored content does not hash to its key."""


class BlobStore:
    """Content-addressed immutable blobs plus named, atomically replaced objects, over ``objects``.

    ``objects`` with a local folder keeps the blobs there (:meth:`blob_path` is the blob itself, mmap-able);
    a remote one downloads them into ``cache_dir`` (default ``$STOKER_HOME/cache``). ``fsync_blobs=False``
    skips the fsyncs of blobs (for scratch stores whose content may be lost). Named objects are fsynced
    unless written with ``durable=False``.
    """

    def __init__(self, objects: ObjectStore, *, cache_dir: str | os.PathLike | None = None,
                 fsync_blobs: bool = True) -> None:
        self.objects = objects
        self.url = objects.url
        self.root: Path | None = objects.local_root
        self.fsync_blobs = fsync_blobs
        if self.root is not None:
            if not isinstance(objects, LocalObjects) or objects.staging is None or "blobs" not in objects.unlisted:
                objects = self.objects = LocalObjects(self.root, error=objects.error, config=objects.config,
                                                      staging=".tmp", unlisted=("blobs",))
            self._files: LocalObjects = objects  # where blob files live: the store itself
            self._cache = False
            folder = self.root / "blobs"
        else:
            self._files = LocalObjects(cache_dir if cache_dir is not None else default_cache_dir(), staging=".tmp")
            self._cache = True
            folder = self._files.root / "blobs"
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create the blob store at {folder.parent}: {e}; set STOKER_HOME or "
                             f"STOKER_STORE to a writable folder") from e
        self.cache_dir = self._files.root if self._cache else None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # --- helpers -------------------------------------------------------------------------------------
    def _write_failed(self, e: StoreError) -> StoreError:
        return StoreError(f"cannot write a blob to the store {self.url}: {e}")

    def _present(self, rel: str, size: int) -> bool:
        """Whether the blob object ``rel`` exists with ``size`` bytes. One of another size was torn (a power cut
        before blobs were fsynced, a full disk, a bad copy): it is reported, and the caller rewrites it."""
        found = self.objects.size(rel)
        if found is None:
            return False
        if found == size:
            return True
        log.warning("blob %s in %s has %d bytes instead of %d (torn by a crash or a bad copy): rewriting it",
                    rel.rsplit("/", 1)[-1], self.url, found, size)
        return False

    def _corrupt(self, key: str, got: str) -> _CorruptBlob:
        where = "downloaded" if self._cache else "read"
        return _CorruptBlob(
            f"blob {key} in the store {self.url} is corrupted (it does not match its hash): the object "
            f"{self.objects.url_of(blob_key_of(key))} hashes to {got}, not to its key (it was overwritten or damaged "
            f"after it was written); what was {where} was discarded. Store the original content again (re-run the "
            f"step that produced it), or delete the object so the blob is reported missing")

    def _missing(self, key: str) -> StoreError:
        return StoreError(f"blob {key} is missing from the store {self.url} (was it garbage-collected, "
                          f"or is STOKER_STORE pointing at another store?)")

    # --- blobs ---------------------------------------------------------------------------------------
    def put_blob(self, data: bytes | memoryview) -> str:
        """Store ``data``; return its sha256 hex key. An existing intact blob is not rewritten."""
        key = hashlib.sha256(data).hexdigest()
        rel = blob_key_of(key)
        if not self._present(rel, memoryview(data).nbytes):
            try:
                self.objects.put_bytes(rel, data, durable=self.fsync_blobs, readonly=True)
            except StoreError as e:
                raise self._write_failed(e) from e
        return key

    def put_blob_stream(self, chunks: Iterable[bytes | memoryview]) -> str:
        """Store the concatenation of ``chunks`` without building it in memory; return its key. The chunks are
        hashed on a helper thread while they are written to a staging file."""
        tmp = self._files.temp_file("put-")
        h, size = PipelinedHash(), 0
        try:
            try:
                with open(tmp, "wb", buffering=0) as f:
                    for chunk in chunks:
                        h.update(chunk)
                        view = memoryview(chunk).cast("B")
                        size += view.nbytes
                        while view.nbytes:  # raw writes may be partial
                            view = view[f.write(view):]
            except OSError as e:
                raise self._write_failed(
                    self._files.failed("writing", os.path.relpath(tmp, self._files.root), e)) from e
            key = h.hexdigest()
            self._commit(tmp, key, size)
        finally:
            h.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        return key

    def _commit(self, path: str | os.PathLike, key: str, size: int, *, move: bool = True) -> None:
        """Store the file ``path`` (hashing to ``key``) as its blob; ``move``: it is gone afterwards."""
        rel = blob_key_of(key)
        try:
            if self._present(rel, size):
                pass
            elif not self._cache:
                (self.objects.move_file if move else self.objects.put_file)(
                    rel, path, durable=self.fsync_blobs, readonly=True)
                return
            else:
                self.objects.put_file(rel, path)
        except StoreError as e:
            raise self._write_failed(e) from e
        if self._cache and move:
            self._keep_in_cache(path, key)  # an upload is kept: the writer often reads it next
        elif move:
            os.unlink(path)

    def put_blob_file(self, path: str | os.PathLike, move: bool = False) -> str:
        """Store a file's content; with ``move=True`` the file is moved in (or deleted if deduplicated)."""
        path = Path(path)
        if not path.is_file():
            raise StoreError(f"cannot store {path}: not a file")
        if not move and not self._cache:
            return self.put_blob_stream(file_chunks(path))  # hashed while copied: one pass over the file
        key = sha256_file(path)
        self._commit(path, key, path.stat().st_size, move=move)
        if self._cache and move and path.exists():
            path.unlink()
        return key

    def get_blob(self, key: str) -> bytes:
        """The content of blob ``key``, verified against its key (StoreError if missing or corrupted)."""
        rel = blob_key_of(key)
        if self._cache and (cached := self._cached(key)) is not None:
            return cached.read_bytes()
        data = self.objects.try_get_bytes(rel)
        if data is None:
            raise self._missing(key)
        if (got := hashlib.sha256(data).hexdigest()) != key:  # signed manifests and specs name blobs by content
            raise self._corrupt(key, got)
        return data

    def blob_path(self, key: str) -> Path:
        """A local file holding blob ``key``: the blob itself for a local store (mmap-able), a cached, verified
        download for a remote one. Never write to it."""
        rel = blob_key_of(key)
        if not self._cache:
            path = self._files.path(rel)
            if not path.exists():
                raise self._missing(key)
            return path
        if (cached := self._cached(key)) is not None:
            return cached
        if not self.objects.exists(rel):
            raise self._missing(key)
        tmp = self._files.temp_file("get-")
        try:
            self.objects.get_file(rel, tmp)
            if (got := sha256_file(tmp)) != key:
                raise self._corrupt(key, got)
            self._keep_in_cache(tmp, key)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        return self._files.path(rel)

    def has_blob(self, key: str) -> bool:
        """Whether blob ``key`` is in the store."""
        return self.objects.exists(blob_key_of(key))

    def verify_blob(self, key: str) -> bool:
        """Re-hash blob ``key`` (a remote one: its cached copy, else a fresh download) and say whether its
        content still matches its key."""
        if not self._cache:
            return sha256_file(self.blob_path(key)) == key
        for _ in range(2):
            try:
                path = self.blob_path(key)
            except _CorruptBlob:
                return False
            if sha256_file(path) == key:
                return True
            log.warning("the cached copy %s of blob %s does not hash to its key: downloading it again", path, key)
            self._drop_cached(key)
        return False

    # former names (they read like ObjectStore's put_bytes(key, data)); kept for callers
    put_bytes = put_blob
    put_stream = put_blob_stream
    put_file = put_blob_file
    get_bytes = get_blob

    # --- the download cache of a remote store ----------------------------------------------------------
    def _drop_cached(self, key: str) -> None:
        self._files.delete(blob_key_of(key))
        self._files.delete(f"{blob_key_of(key)}.size")

    def _cached(self, key: str) -> Path | None:
        """The cached copy of blob ``key`` if there is one and it is intact, else None (a damaged copy is
        deleted). Intact: the size recorded when it entered the cache, or (no record) its hash."""
        rel = blob_key_of(key)
        size = self._files.size(rel)
        if size is None:
            return None
        dest = self._files.path(rel)
        try:
            recorded: int | None = int(self._files.try_get_bytes(f"{rel}.size") or b"")
        except ValueError:
            recorded = None
        if recorded is None:  # cached before sizes were recorded, or the record was lost: hash it once
            if sha256_file(dest) == key:
                self._files.put_bytes(f"{rel}.size", str(size).encode())
                return dest
            problem = "its content does not hash to its key"
        elif size == recorded:
            return dest
        else:
            problem = f"it has {size} bytes instead of {recorded}"
        log.warning("the cached copy %s of blob %s is damaged (%s): deleting it and downloading the blob again",
                    dest, key, problem)
        self._drop_cached(key)
        return None

    def _keep_in_cache(self, path: str | os.PathLike, key: str) -> None:
        """Move the verified file ``path`` into the cache as blob ``key`` (its size recorded first)."""
        if self._cached(key) is not None:  # another process cached it meanwhile
            os.unlink(path)
            return
        rel = blob_key_of(key)
        self._files.put_bytes(f"{rel}.size", str(os.path.getsize(path)).encode())  # a cached blob has its size
        self._files.move_file(rel, path, readonly=True)

    # --- named, mutable objects ----------------------------------------------------------------------
    def write(self, name: str, data: bytes, *, durable: bool = True) -> None:
        """Atomically create or replace the object ``name``. ``durable=False`` skips the fsyncs (for logs and
        other objects that may be lost in a power cut); readers never see a torn object."""
        self.objects.put_bytes(check_name(name), data, durable=durable)

    def read(self, name: str) -> bytes:
        """The content of object ``name`` (StoreError naming it if missing)."""
        data = self.objects.try_get_bytes(check_name(name))
        if data is None:
            raise StoreError(f"object {name!r} does not exist in the store {self.url}")
        return data

    def exists(self, name: str) -> bool:
        """Whether object ``name`` exists."""
        return self.objects.exists(check_name(name))

    def list(self, prefix: str = "") -> list[str]:
        """Sorted names of the objects whose name starts with ``prefix`` (blobs are not listed)."""
        if prefix:
            check_name(prefix.rstrip("/") or "x")
        return [o.key for o in self.objects.list(prefix) if not o.key.startswith(("blobs/", ".tmp/"))]

    def delete(self, name: str) -> None:
        """Delete object ``name``; deleting a missing object is not an error."""
        self.objects.delete(check_name(name))

    def local_path(self, name: str) -> Path | None:
        """The local file of object ``name`` (it may not exist yet), or None for a remote store."""
        return None if self.root is None else self.root / check_name(name)


class LocalBlobStore(BlobStore):
    """A blob store in a local folder (the default: ``$STOKER_HOME/store``)."""

    def __init__(self, root: str | os.PathLike, *, fsync_blobs: bool = True) -> None:
        super().__init__(LocalObjects(root, staging=".tmp", unlisted=("blobs",)), fsync_blobs=fsync_blobs)


class S3BlobStore(BlobStore):
    """A blob store at ``s3://bucket/prefix``; ``client`` is a boto3 S3 client (created if omitted, see
    :func:`stoker.store.objects.s3_client`), ``config`` the transfer settings (default: ``$STOKER_S3_*``)."""

    def __init__(self, bucket: str, prefix: str = "", *, client: Any = None,
                 cache_dir: str | os.PathLike | None = None, config: TransferConfig | None = None) -> None:
        if not bucket:
            raise StoreError("an S3 store URL needs a bucket: s3://bucket/prefix")
        objects = S3Objects(bucket, prefix, client=client, error=StoreError, config=config)
        super().__init__(objects, cache_dir=cache_dir)
        self.bucket, self.prefix, self.client = bucket, objects.prefix, objects.client

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> S3BlobStore:
        """Open ``s3://bucket/prefix``."""
        if not url.startswith("s3://"):
            raise StoreError(f"{url!r} is not an s3:// URL")
        bucket, _, prefix = url[len("s3://"):].partition("/")
        return cls(bucket, prefix, **kwargs)


def open_store(url: str | os.PathLike | None = None, **kwargs: Any) -> BlobStore:
    """Open the blob store at ``url``: a folder, ``file://folder`` or ``s3://bucket/prefix``.

    ``None`` means :func:`stoker.store.paths.default_store_url` (``$STOKER_STORE`` or
    ``$STOKER_HOME/store``). Keyword arguments go to the store's constructor (e.g. ``client=`` for S3).
    """
    url = default_store_url() if url is None else os.fspath(url)
    if url.startswith("s3://"):
        return S3BlobStore.from_url(url, **kwargs)
    if url.startswith("file://"):
        url = url[len("file://"):]
    if "://" in url:
        raise StoreError(f"unsupported store URL {url!r}: use a folder path or s3://bucket/prefix")
    return LocalBlobStore(url, **kwargs)

