"""The blob store on S3 (or any S3 API: MinIO, moto) with a local download cache.

Same layout as the local store under ``s3://bucket/prefix``. S3 PUTs are atomic, so named objects need
no temp+rename; every transfer goes through :mod:`stoker.store.objects_s3` (large blobs as parallel
multipart uploads and ranged downloads). Downloaded blobs are kept
in a local cache (``$STOKER_HOME/cache`` by default) so ``blob_path`` can hand numpy a real file.

Nothing read from S3 is trusted: every download is hashed and must match its key (a blob overwritten
or damaged in the bucket is refused, never cached). A cached blob is hashed when it enters the cache,
which records its size next to it (``<key>.size``); every later use checks that size, and a cached copy
without a record is hashed again. A damaged cached copy is deleted and downloaded again.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from stoker.errors import StoreError
from stoker.store.blob_base import BlobStore, check_key, check_name, hash_file
from stoker.store.objects import TransferConfig
from stoker.store.objects_s3 import S3Objects
from stoker.store.paths import default_cache_dir

log = logging.getLogger(__name__)


class _CorruptBlob(StoreError):
    """A blob whose content in S3 does not hash to its key."""


class S3BlobStore(BlobStore):
    """A blob store at ``s3://bucket/prefix``; ``client`` is a boto3 S3 client (created if omitted, see
    :func:`stoker.store.objects_s3.s3_client`), ``config`` the transfer settings (default: ``$STOKER_S3_*``)."""

    def __init__(self, bucket: str, prefix: str = "", *, client: Any = None,
                 cache_dir: str | os.PathLike | None = None, config: TransferConfig | None = None) -> None:
        if not bucket:
            raise StoreError("an S3 store URL needs a bucket: s3://bucket/prefix")
        self.objects = S3Objects(bucket, prefix, client=client, error=StoreError, config=config)
        self.bucket, self.prefix, self.url = bucket, self.objects.prefix, self.objects.url
        self.client = self.objects.client
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self._cache_blobs = self.cache_dir / "blobs"
        self._cache_tmp = self.cache_dir / ".tmp"
        self._cache_blobs.mkdir(parents=True, exist_ok=True)
        self._cache_tmp.mkdir(parents=True, exist_ok=True)

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> S3BlobStore:
        """Open ``s3://bucket/prefix``."""
        if not url.startswith("s3://"):
            raise StoreError(f"{url!r} is not an s3:// URL")
        bucket, _, prefix = url[len("s3://"):].partition("/")
        return cls(bucket, prefix, **kwargs)

    # --- keys --------------------------------------------------------------------------------------
    def _k(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    @staticmethod
    def _blob_rel(key: str) -> str:
        """The object key of blob ``key`` relative to the store's root."""
        check_key(key)
        return f"blobs/{key[:2]}/{key}"

    def _blob_key(self, key: str) -> str:
        return self._k(self._blob_rel(key))

    def _cache_file(self, key: str) -> Path:
        return self._cache_blobs / key[:2] / key

    def _size_file(self, key: str) -> Path:
        return self._cache_blobs / key[:2] / f"{key}.size"

    def _corrupt(self, key: str, got: str) -> _CorruptBlob:
        return _CorruptBlob(
            f"blob {key} in the store {self.url} is corrupted: the object s3://{self.bucket}/{self._blob_key(key)} "
            f"hashes to {got}, not to its key (it was overwritten or damaged in the bucket); the download was "
            f"discarded. Store the original content again (re-run the step that produced it), or delete the "
            f"object so the blob is reported missing")

    def _drop_cached(self, key: str) -> None:
        for path in (self._cache_file(key), self._size_file(key)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def _cached(self, key: str) -> Path | None:
        """The cached copy of blob ``key`` if there is one and it is intact, else None (a damaged copy is
        deleted). Intact: the size recorded when it entered the cache, or (no record) its hash."""
        dest = self._cache_file(key)
        try:
            size = dest.stat().st_size
        except FileNotFoundError:
            return None
        try:
            recorded: int | None = int(self._size_file(key).read_text())
        except (OSError, ValueError):
            recorded = None
        if recorded is None:  # cached before sizes were recorded, or the record was lost: hash it once
            if hash_file(dest) == key:
                self._record_size(key, size)
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

    def _record_size(self, key: str, size: int) -> None:
        fd, tmp = tempfile.mkstemp(dir=self._cache_tmp, prefix="size-")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(str(size))
            os.replace(tmp, self._size_file(key))
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def _keep_in_cache(self, tmp: str, key: str, *, verified: bool) -> None:
        """Move the file ``tmp`` into the cache as blob ``key``. Unless ``verified`` (hashed while written),
        it is hashed first: a file that does not match its key is deleted and a StoreError raised."""
        if not verified and (got := hash_file(tmp)) != key:
            os.unlink(tmp)
            raise self._corrupt(key, got)
        size = os.path.getsize(tmp)
        dest = self._cache_file(key)
        dest.parent.mkdir(exist_ok=True)
        if self._cached(key) is not None:  # another process cached it meanwhile
            os.unlink(tmp)
            return
        self._record_size(key, size)  # before the blob: a cached blob always has its size recorded
        os.chmod(tmp, 0o444)
        os.replace(tmp, dest)

    # --- blobs -------------------------------------------------------------------------------------
    def put_bytes(self, data: bytes | memoryview) -> str:
        key = hashlib.sha256(data).hexdigest()
        if not self.objects.exists(self._blob_rel(key)):
            self.objects.put_bytes(self._blob_rel(key), data)
        return key

    def put_stream(self, chunks: Iterable[bytes | memoryview]) -> str:
        fd, tmp = tempfile.mkstemp(dir=self._cache_tmp, prefix="put-")
        h = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    h.update(chunk)
                    f.write(chunk)
            key = h.hexdigest()
            self._upload(tmp, key)
            self._keep_in_cache(tmp, key, verified=True)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return key

    def _upload(self, path: str | os.PathLike, key: str) -> None:
        if not self.objects.exists(self._blob_rel(key)):
            self.objects.put_file(self._blob_rel(key), path)

    def put_file(self, path: str | os.PathLike, move: bool = False) -> str:
        path = Path(path)
        if not path.is_file():
            raise StoreError(f"cannot store {path}: not a file")
        key = hash_file(path)
        self._upload(path, key)
        if move:
            path.unlink()
        return key

    def get_bytes(self, key: str) -> bytes:
        cached = self._cached(check_key(key))
        if cached is not None:
            return cached.read_bytes()
        data = self._get(self._blob_rel(key), f"blob {key} is missing from the store {self.url}")
        if (got := hashlib.sha256(data).hexdigest()) != key:
            raise self._corrupt(key, got)
        return data

    def blob_path(self, key: str) -> Path:
        dest = self._cached(check_key(key))
        if dest is not None:
            return dest
        dest = self._cache_file(key)
        if not self.objects.exists(self._blob_rel(key)):
            raise StoreError(f"blob {key} is missing from the store {self.url}")
        fd, tmp = tempfile.mkstemp(dir=self._cache_tmp, prefix="get-")
        os.close(fd)
        try:
            self.objects.get_file(self._blob_rel(key), tmp)
            self._keep_in_cache(tmp, key, verified=False)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return dest

    def has_blob(self, key: str) -> bool:
        return self.objects.exists(self._blob_rel(key))

    def verify_blob(self, key: str) -> bool:
        """Whether blob ``key`` matches its key: its cached copy, else a fresh download, is hashed."""
        for _ in range(2):
            try:
                path = self.blob_path(key)
            except _CorruptBlob:
                return False
            if hash_file(path) == key:
                return True
            log.warning("the cached copy %s of blob %s does not hash to its key: downloading it again", path, key)
            self._drop_cached(key)
        return False

    # --- named objects -----------------------------------------------------------------------------
    def write(self, name: str, data: bytes, *, durable: bool = True) -> None:
        self.objects.put_bytes(check_name(name), data)  # one PUT: atomic on S3

    def read(self, name: str) -> bytes:
        return self._get(check_name(name), f"object {name!r} does not exist in the store {self.url}")

    def _get(self, rel: str, missing: str) -> bytes:
        data = self.objects.try_get_bytes(rel)
        if data is None:
            raise StoreError(missing)
        return data

    def exists(self, name: str) -> bool:
        return self.objects.exists(check_name(name))

    def list(self, prefix: str = "") -> list[str]:
        if prefix:
            check_name(prefix.rstrip("/") or "x")
        return [o.key for o in self.objects.list(prefix) if not o.key.startswith(("blobs/", ".tmp/"))]

    def delete(self, name: str) -> None:
        self.objects.delete(check_name(name))

    def local_path(self, name: str) -> Path | None:
        return None
