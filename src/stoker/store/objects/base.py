"""The object-store interface (:class:`ObjectStore`) and its configuration (:class:`TransferConfig`); the
implementations are :mod:`.local`, :mod:`.s3` and :mod:`.fsspec_store`, and :func:`stoker.store.objects.open_objects`
opens a store of any kind (see the package's docstring)."""


from __future__ import annotations

import hashlib
import io
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from stoker._hashing import SHA256, content_key, file_key, key_algo, key_of, sha256_file
from stoker.errors import ConfigError, StokerError, StoreError

MiB = 1 << 20
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": MiB, "mb": 10**6, "mib": MiB,
          "g": 1 << 30, "gb": 10**9, "gib": 1 << 30}
T = TypeVar("T")


def parse_bytes(text: str, setting: str) -> int:
    """``"16MiB"`` -> 16777216 (plain integers are bytes); ConfigError naming ``setting`` otherwise."""
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m[2].lower() not in _UNITS:
        raise ConfigError(f"{setting}={text!r} is not a size: give bytes or a number with KiB, MiB or GiB "
                          f"(e.g. {setting}=16MiB)")
    return int(m[1]) * _UNITS[m[2].lower()]


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number; set it to e.g. {name}={default}") from None


@dataclass(kw_only=True)
class TransferConfig:
    """How stoker reaches object stores; :meth:`from_env` reads ``$STOKER_S3_*`` (the one place)."""

    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    concurrency: int = 16
    part_size: int = 16 * MiB
    multipart_threshold: int = 0  # 0: the part size
    max_attempts: int = 3
    connect_timeout: float = 10.0
    read_timeout: float = 120.0
    extra: dict[str, Any] = field(default_factory=dict)  # storage options for fsspec drivers

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigError(f"STOKER_S3_CONCURRENCY={self.concurrency}: give 1 or more parallel transfers")
        if self.part_size < 5 * MiB:
            raise ConfigError(f"STOKER_S3_PART_SIZE={self.part_size} bytes: S3 parts are at least 5MiB; "
                              "give e.g. STOKER_S3_PART_SIZE=16MiB")
        if self.multipart_threshold <= 0:
            self.multipart_threshold = self.part_size
        if self.max_attempts < 1:
            raise ConfigError(f"STOKER_S3_MAX_ATTEMPTS={self.max_attempts}: give 1 or more")

    @classmethod
    def from_env(cls, **overrides: Any) -> TransferConfig:
        env = os.environ
        part = parse_bytes(env["STOKER_S3_PART_SIZE"], "STOKER_S3_PART_SIZE") \
            if env.get("STOKER_S3_PART_SIZE", "").strip() else 16 * MiB
        threshold = parse_bytes(env["STOKER_S3_MULTIPART_THRESHOLD"], "STOKER_S3_MULTIPART_THRESHOLD") \
            if env.get("STOKER_S3_MULTIPART_THRESHOLD", "").strip() else 0
        values: dict[str, Any] = dict(
            endpoint_url=env.get("STOKER_S3_ENDPOINT_URL") or None,
            region=env.get("STOKER_S3_REGION") or None,
            profile=env.get("STOKER_S3_PROFILE") or None,
            concurrency=_env_int("STOKER_S3_CONCURRENCY", 16),
            part_size=part, multipart_threshold=threshold,
            max_attempts=_env_int("STOKER_S3_MAX_ATTEMPTS", 3),
            read_timeout=float(_env_int("STOKER_S3_READ_TIMEOUT", 120)),
        )
        values.update(overrides)
        return cls(**values)


@dataclass(frozen=True)
class ObjectInfo:
    """One listed object: its key (relative to the store's root), size, and version tag (ETag / mtime)."""

    key: str
    size: int
    etag: str = ""


def check_object_key(key: str, error: type[StokerError] = StoreError) -> str:
    """``key`` if it is a relative ``/``-separated name without ``..`` (else ``error``)."""
    if not isinstance(key, str) or key.startswith("/") or "\\" in key or ".." in key.split("/"):
        raise error(f"{key!r} is not an object key: use a relative name like 'train/shard-00000.bin'")
    return key



class ObjectStore(ABC):
    """Objects under one root URL. Subclasses implement the primitives; transfers of many objects and
    download verification are shared here."""

    url: str
    error: type[StokerError]
    config: TransferConfig

    # --- primitives -----------------------------------------------------------------------------------
    @abstractmethod
    def put_bytes(self, key: str, data: bytes | memoryview, *, durable: bool = False, readonly: bool = False) -> None:
        """Create or replace object ``key`` (atomically: readers see the old or the new content).

        ``durable``: the object survives a power cut once this returns (a local store fsyncs the file before it
        is named and its folder after; a remote PUT that returned is durable anyway). ``readonly``: a local file
        is made read-only (content that is never changed in place, such as a blob); remote stores ignore it."""

    @abstractmethod
    def try_get_bytes(self, key: str) -> bytes | None:
        """The content of ``key``, None when it does not exist (one request for a small object)."""

    def get_bytes(self, key: str, *, sha256: str | None = None) -> bytes:
        """The content of ``key`` (``error`` naming it if missing; verified when ``sha256`` is given)."""
        data = self.try_get_bytes(key)
        if data is None:
            raise self.missing(key)
        return self.verified(key, data, sha256)

    def get_buffer(self, key: str, *, sha256: str | None = None, size: int | None = None) -> bytes | memoryview:
        """Like :meth:`get_bytes` for large objects read once (checkpoint shards): a read-only buffer that may be
        memory the download landed in, without the copy into ``bytes`` (the S3 store's is). Checked against
        ``size`` (:meth:`wrong_size`) and ``sha256`` (:meth:`corrupt`) when given."""
        data = self.get_bytes(key)
        if size is not None and len(data) != size:
            raise self.wrong_size(key, len(data), size)
        return self.verified(key, data, sha256)

    @abstractmethod
    def get_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes of ``key`` from offset ``start``."""

    @abstractmethod
    def put_file(self, key: str, path: str | os.PathLike, *, durable: bool = False, readonly: bool = False) -> None:
        """Upload the local file ``path`` as ``key`` (in parallel parts when large); ``durable`` and ``readonly``
        as for :meth:`put_bytes`."""

    def move_file(self, key: str, path: str | os.PathLike, *, durable: bool = False, readonly: bool = False) -> None:
        """Like :meth:`put_file`, then the file ``path`` is gone (a local store renames it in, without a copy,
        when it is on the same file system)."""
        self.put_file(key, path, durable=durable, readonly=readonly)
        os.unlink(path)

    @abstractmethod
    def _download(self, key: str, dest: str, *, hashed: bool = False, algo: str = SHA256) -> str | None:
        """Write object ``key`` into the new local file ``dest`` (in parallel ranges when large); with ``hashed``
        it may return the hex digest (``algo``: sha256 or blake3) it computed on the way (None: the caller hashes
        the file)."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix`` (a key prefix, not a folder), sorted by key."""

    @abstractmethod
    def size(self, key: str) -> int | None:
        """The size of ``key``, None when it does not exist."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Delete ``key``; deleting a missing object is not an error."""

    def exists(self, key: str) -> bool:
        return self.size(key) is not None

    def open_write(self, key: str) -> Upload:
        """A writable stream that becomes object ``key`` when closed (nothing is written if the ``with`` block
        fails); its ``sha256`` and ``size`` are known after it closes. This one buffers in memory; the S3 one
        uploads parts in parallel while the caller keeps writing."""
        return BufferedUpload(self, key)

    def delete_many(self, keys: list[str]) -> None:
        """Delete every key of ``keys`` (missing ones are no error)."""
        self._pool_map(self.delete, list(keys))

    def url_of(self, key: str = "") -> str:
        return f"{self.url.rstrip('/')}/{key}" if key else self.url

    @property
    def local_root(self) -> Path | None:
        """The folder of a local store (None for a remote one)."""
        return None

    # --- shared ------------------------------------------------------------------------------------
    def get_file(self, key: str, path: str | os.PathLike, *, sha256: str | None = None,
                 algo: str | None = None) -> str | None:
        """Download ``key`` to ``path`` (written under a temporary name, then renamed). With ``sha256`` (a sha256
        hex digest, or a content key ``b3-...``) the file is verified first: a mismatch deletes it and raises
        ``error``. With ``algo`` (``sha256`` or ``blake3``) the content key of what landed is returned (hashed
        while the ranges land where the store can), for the caller to check."""
        path = os.fspath(path)
        tmp = f"{path}.{os.urandom(4).hex()}.part"  # (not uuid: it imports platform, ~2 ms of every start)
        if sha256 is not None:
            algo = key_algo(sha256) or SHA256
        got = None
        try:
            if algo is None:
                self._download(key, tmp)
            else:
                digest = self._download(key, tmp, hashed=True, algo=algo)  # (a digest if it hashed on the way)
                got = key_of(algo, digest) if digest else sha256_file(tmp) if algo == SHA256 else file_key(tmp, algo)
            if sha256 is not None and got != sha256:
                raise self.corrupt(key, str(got), sha256)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return got

    def corrupt(self, key: str, got: str, want: str) -> StokerError:
        return self.error(f"{self.url_of(key)} is corrupted: its content hashes to {got[:16]}..., its record says "
                          f"{want[:16]}... (damaged or overwritten in storage); the download was discarded. "
                          "Write it again from its source")

    def wrong_size(self, key: str, got: int, want: int) -> StokerError:
        return self.error(f"{self.url_of(key)} has {got} bytes, its record says {want}: it is truncated or was "
                          "overwritten in storage. Write it again from its source")

    def missing(self, key: str) -> StokerError:
        return self.error(f"{self.url_of(key)} does not exist; check the URL (and STOKER_S3_ENDPOINT_URL for an "
                          "S3-compatible server)")

    def verified(self, key: str, data: bytes, sha256: str | None) -> bytes:
        if sha256 is not None and (got := content_key(data, key_algo(sha256) or SHA256)) != sha256:
            raise self.corrupt(key, got, sha256)
        return data

    def _pool_map(self, fn: Callable[[T], Any], items: list[T]) -> list[Any]:
        if len(items) <= 1:
            return [fn(item) for item in items]
        with ThreadPoolExecutor(max_workers=min(self.config.concurrency, len(items)),
                                thread_name_prefix="stoker-objects") as pool:
            return list(pool.map(fn, items))

    def put_many(self, files: Iterable[tuple[str, str | os.PathLike]]) -> None:
        """Upload (key, local path) pairs, ``concurrency`` at a time."""
        self._pool_map(lambda kv: self.put_file(kv[0], kv[1]), list(files))

    def get_many(self, files: Iterable[tuple[str, str | os.PathLike, str | None]]) -> None:
        """Download (key, local path, sha256 or None) triples, ``concurrency`` at a time."""
        self._pool_map(lambda t: self.get_file(t[0], t[1], sha256=t[2]), list(files))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


class Upload(io.RawIOBase):
    """A stream written into an object: ``write``/``tell``, ``close`` commits, leaving a ``with`` block on an
    error discards. Hashes what is written (``sha256``, ``size``)."""

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key
        self.size = 0
        self._hash = hashlib.sha256()
        self.sha256 = ""

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.size

    def write(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        self._hash.update(view)
        self.size += view.nbytes
        self._take(view)
        return view.nbytes

    @abstractmethod
    def _take(self, view: memoryview) -> None: ...

    @abstractmethod
    def _commit(self) -> None: ...

    def abort(self) -> None:
        """Discard what was written (the object is not created)."""
        super().close()

    def close(self) -> None:
        if not self.closed:
            self.sha256 = self._hash.hexdigest()
            try:
                self._commit()
            finally:
                super().close()

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()

    def __del__(self) -> None:
        if not self.closed:  # dropped unclosed (an error): never commit half an object
            self.abort()


class BufferedUpload(Upload):
    """An upload kept in memory and stored with one ``put_bytes`` when closed."""

    def __init__(self, store: ObjectStore, key: str) -> None:
        super().__init__(key)
        self._store = store
        self._buf = io.BytesIO()

    def _take(self, view: memoryview) -> None:
        self._buf.write(view)

    def _commit(self) -> None:
        with self._buf.getbuffer() as data:
            self._store.put_bytes(self.key, data)
        self._buf = io.BytesIO()
