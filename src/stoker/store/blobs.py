"""Content-addressed blobs and named objects over any object store (:mod:`stoker.store.objects`).

Layout of a store root (a local folder, or ``s3://bucket/prefix``)::

    blobs/<digest[:2]>/<key>  immutable blobs, key = the content's hash (deduplicated): ``b3-<hex>`` (BLAKE3, the
                              blobs of artifacts) or ``<hex>`` (sha256: blobs stored before, and code packages,
                              task specs, the Neuron cache)
    <name>                    named objects, e.g. runs/<flow>/<run>/<step>/<task>/<attempt>/manifest.json
    .tmp/                     staging area of a local store (same file system, so rename is atomic)

:class:`BlobStore` is the one implementation; it does no I/O of its own (the object store writes under a
temporary name and renames, uploads in parts, lists). What it adds is content addressing:

- a put returns the blob's key only once the blob is durable (a local store fsyncs the file and its
  folder), so a manifest written after it never names a missing or torn blob; a put that finds the blob
  already there checks it (its size; in a local store also its hash, once per process) and rewrites a damaged
  one. Local blobs are read-only (0444).
- nothing is returned unverified: :meth:`BlobStore.get_blob` hashes what it read, :meth:`BlobStore.read_blob`
  hashes what its reader returns (a memory map: its pages), :meth:`BlobStore.blob_path` hashes the file. A file
  that hashed to its key is remembered for the rest of the process by its identity (device, inode, size, mtime,
  ctime: any write changes them), so a memory-mapped blob is hashed once per process, not on every load. A
  remote store keeps downloaded blobs in a local cache (``$STOKER_HOME/cache``) so a blob can be a real file: a
  download is hashed while it lands, before it enters the cache, which records its size next to it
  (``<key>.size``); a cached copy is checked like a local blob, and a damaged one is deleted and downloaded again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from stoker._hashing import CHUNK, SHA256, PipelinedHash, content_key, file_key, key_algo
from stoker.errors import StoreError
from stoker.store.objects import LocalObjects, ObjectStore, S3Objects, TransferConfig
from stoker.store.paths import default_cache_dir, default_store_url

log = logging.getLogger(__name__)

_RESERVED = ("blobs", ".tmp")
_VERIFIED: set[tuple[str, int, int, int, int, int]] = set()  # (key, *identity) of files that hashed to their key
_VERIFIED_MAX = 1 << 20
_verified_lock = threading.Lock()


def check_key(key: str) -> str:
    """Return ``key`` if it is a content key (a sha256 hex digest, or ``b3-`` and a BLAKE3 one), else raise
    StoreError."""
    if key_algo(key) is None:
        raise StoreError(f"{key!r} is not a blob key (expected 64 lowercase hex digits of a sha256, or b3- and 64 "
                         f"of a BLAKE3)")
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
    """The object key of blob ``key`` relative to the store's root (its folder: the digest's first 2 hex digits)."""
    check_key(key)
    return f"blobs/{key[-64:-62]}/{key}"


def hash_of(key: str, data: Any) -> str:
    """The content key of ``data`` (bytes or any contiguous buffer) under the hash ``key`` names."""
    try:
        return content_key(data, key_algo(check_key(key)) or SHA256)
    except ImportError as e:
        raise StoreError(f"cannot verify blob {key}: {e}") from None


def _file_hash(key: str, path: str | os.PathLike) -> str:
    try:
        return file_key(path, key_algo(check_key(key)) or SHA256)
    except ImportError as e:
        raise StoreError(f"cannot verify blob {key}: {e}") from None


def _identity(path: str | os.PathLike) -> tuple[int, int, int, int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _remember(key: str, identity: tuple[int, int, int, int, int]) -> None:
    """Record that the file of this identity holds blob ``key`` (it hashed to it, or was written from what did)."""
    with _verified_lock:
        if len(_VERIFIED) >= _VERIFIED_MAX:
            _VERIFIED.clear()
        _VERIFIED.add((key, *identity))


def _known(key: str, identity: tuple[int, int, int, int, int]) -> bool:
    return (key, *identity) in _VERIFIED


class CorruptBlobError(StoreError):
    """A blob whose stored content does not hash to its key (``key``; ``got``: what it hashes to; ``where``: the
    object or file read; ``remote``: whether it is an object of a remote store, which a put does not rewrite)."""

    def __init__(self, message: str, *, key: str, got: str, where: str, remote: bool) -> None:
        super().__init__(message)
        self.key, self.got, self.where, self.remote = key, got, where, remote



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

    def _present(self, key: str, size: int) -> bool:
        """Whether blob ``key`` is stored intact with ``size`` bytes. One of another size was torn (a power cut
        before blobs were fsynced, a full disk, a bad copy), a local one that does not hash to its key was changed
        after it was written: either is reported, and the caller rewrites it. (A remote object is checked for its
        size only; hashing it would mean downloading it. A download is verified anyway.)"""
        found = self.objects.size(blob_key_of(key))
        if found is None:
            return False
        if found != size:
            log.warning("blob %s in %s has %d bytes instead of %d (torn by a crash or a bad copy): rewriting it",
                        key, self.url, found, size)
            return False
        if self._cache:
            return True
        path = self._files.path(blob_key_of(key))
        try:
            identity = _identity(path)
            if _known(key, identity) or _file_hash(key, path) == key:
                _remember(key, identity)
                return True
        except FileNotFoundError:
            return False
        log.warning("blob %s in %s does not hash to its key (it was changed after it was written): rewriting it",
                    key, self.url)
        return False

    def _wrote(self, key: str) -> None:
        """Remember the local file of blob ``key`` just written from content that hashed to it: its reads in this
        process need not hash it again."""
        with contextlib.suppress(OSError):
            _remember(key, _identity(self._files.path(blob_key_of(key))))

    def _corrupt(self, key: str, got: str, path: Path | None = None) -> CorruptBlobError:
        """The error of blob ``key`` hashing to ``got``: as downloaded from a remote store, or (``path``) as read
        from the local file."""
        if path is None:
            where = self.objects.url_of(blob_key_of(key))
            return CorruptBlobError(
                f"blob {key} in the store {self.url} is corrupted (it does not match its hash): the object {where} "
                f"hashes to {got}, not to its key (it was overwritten or damaged after it was written); what was "
                f"downloaded was discarded. Restore the object from a copy, or delete it and re-run the step that "
                f"produced it (a put skips a blob already stored)", key=key, got=got, where=where, remote=True)
        return CorruptBlobError(
            f"blob {key} in the store {self.url} is corrupted (it does not match its hash): the file {path} hashes "
            f"to {got}, not to its key (it was changed after it was written); nothing read from it was returned. "
            f"Re-run the step that produced it (a put rewrites a damaged blob), or restore the file from a copy",
            key=key, got=got, where=str(path), remote=False)

    def _missing(self, key: str) -> StoreError:
        return StoreError(f"blob {key} is missing from the store {self.url} (was it garbage-collected, "
                          f"or is STOKER_STORE pointing at another store?)")

    # --- blobs ---------------------------------------------------------------------------------------
    def put_blob(self, data: bytes | memoryview, *, algo: str = SHA256) -> str:
        """Store ``data``; return its content key (``algo``: ``sha256``, or ``blake3`` for a ``b3-`` key). An
        existing intact blob is not rewritten."""
        key = content_key(data, algo)
        if not self._present(key, memoryview(data).nbytes):
            try:
                self.objects.put_bytes(blob_key_of(key), data, durable=self.fsync_blobs, readonly=True)
            except StoreError as e:
                raise self._write_failed(e) from e
            if not self._cache:
                self._wrote(key)
        return key

    def put_blob_stream(self, chunks: Iterable[bytes | memoryview], *, algo: str = SHA256) -> str:
        """Store the concatenation of ``chunks`` without building it in memory; return its key (``algo`` as for
        :meth:`put_blob`). The chunks are hashed on a helper thread while they are written to a staging file."""
        tmp = self._files.temp_file("put-")
        h, size = PipelinedHash(algo), 0
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
            key = h.key()
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
            if self._present(key, size):
                pass
            elif not self._cache:
                (self.objects.move_file if move else self.objects.put_file)(
                    rel, path, durable=self.fsync_blobs, readonly=True)
                if move:
                    self._wrote(key)
                return
            else:
                self.objects.put_file(rel, path)
        except StoreError as e:
            raise self._write_failed(e) from e
        if self._cache and move:
            self._keep_in_cache(path, key)  # an upload is kept: the writer often reads it next
        elif move:
            os.unlink(path)

    def put_blob_file(self, path: str | os.PathLike, move: bool = False, *, algo: str = SHA256) -> str:
        """Store a file's content; with ``move=True`` the file is moved in (or deleted if deduplicated). ``algo``
        as for :meth:`put_blob`."""
        path = Path(path)
        if not path.is_file():
            raise StoreError(f"cannot store {path}: not a file")
        if not move and not self._cache:
            return self.put_blob_stream(file_chunks(path), algo=algo)  # hashed while copied: one pass over the file
        key = file_key(path, algo)
        self._commit(path, key, path.stat().st_size, move=move)
        if self._cache and move and path.exists():
            path.unlink()
        return key

    def get_blob(self, key: str) -> bytes:
        """The content of blob ``key``, verified against its key (StoreError if missing, CorruptBlobError if
        corrupted): what was read is hashed, every time (a pickle's body is unpickled only after that)."""
        if not self._cache or self._cached(key) is not None:
            return self.read_blob(key, Path.read_bytes, once=False)
        data = self.objects.try_get_bytes(blob_key_of(key))
        if data is None:
            raise self._missing(key)
        if (got := hash_of(key, data)) != key:  # signed manifests and specs name blobs by content
            raise self._corrupt(key, got)
        return data

    def read_blob(self, key: str, reader: Callable[[Path], Any], *, once: bool = True) -> Any:
        """What ``reader(path)`` returns for the local file of blob ``key`` (the blob itself, or a cached download),
        once that (the file's whole content: bytes, or any contiguous buffer, such as a memory map, whose pages are
        then hashed where they lie) hashes to the key. With ``once``, a file this process already verified (same
        identity) is not hashed again. A corrupted blob raises CorruptBlobError and nothing is returned; a damaged
        cached copy of a remote blob is downloaded again."""
        return self._checked(key, reader, lambda path, data: hash_of(key, data), once)

    def _checked(self, key: str, load: Callable[[Path], Any], digest: Callable[[Path, Any], str], once: bool) -> Any:
        for again in (False, True):
            path = self._blob_file(key)
            try:
                identity = _identity(path)  # before reading: a write while it is read gives it another identity
                value = load(path)
            except FileNotFoundError:
                raise self._missing(key) from None
            if once and _known(key, identity):
                return value
            got = digest(path, value)
            if got == key:
                _remember(key, identity)
                return value
            del value
            if not self._cache or again:
                raise self._corrupt(key, got, path)
            log.warning("the cached copy %s of blob %s does not hash to its key (changed after it was downloaded): "
                        "deleting it and downloading the blob again", path, key)
            self._drop_cached(key)
        raise AssertionError("unreachable")

    def blob_path(self, key: str, *, verify: bool = True) -> Path:
        """A local file holding blob ``key``: the blob itself for a local store (mmap-able), a cached download for a
        remote one. Verified (hashed, once per process per file; :meth:`read_blob`) unless ``verify=False``, for a
        caller that verifies what it reads itself. Never write to it."""
        if not verify:
            return self._blob_file(key)
        return self._checked(key, lambda path: path, lambda path, _: _file_hash(key, path), True)

    def _blob_file(self, key: str) -> Path:
        """The local file of blob ``key``: the blob of a local store, or the cached copy of a remote blob (its
        download hashed while it lands, and refused unless it matches the key)."""
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
            try:
                got = self.objects.get_file(rel, tmp, algo=key_algo(key))
            except ImportError as e:
                raise StoreError(f"cannot verify blob {key}: {e}") from None
            if got != key:
                raise self._corrupt(key, str(got))
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
            return _file_hash(key, self._blob_file(key)) == key
        for _ in range(2):
            try:
                path = self._blob_file(key)
            except CorruptBlobError:
                return False
            if _file_hash(key, path) == key:
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
        deleted). Intact: the size recorded when it entered the cache, or (no record) its hash. (Its content is
        hashed by whoever reads it, once per process.)"""
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
            identity = _identity(dest)
            if _file_hash(key, dest) == key:
                _remember(key, identity)
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
        with contextlib.suppress(OSError):
            _remember(key, _identity(self._files.path(rel)))

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

