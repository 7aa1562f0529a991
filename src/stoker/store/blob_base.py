"""The blob store's interface and naming rules (keys, object names), apart from its implementations so that
each backend (:mod:`stoker.store.blob` local, :mod:`stoker.store.s3`) imports them without importing the
others (imports point one way: ``blob`` opens ``s3``, both use this module)."""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from pathlib import Path

from stoker._hashing import sha256_file
from stoker.errors import StoreError

CHUNK = 8 << 20  # bytes per read/write when streaming files
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
        while True:
            data = f.read(chunk)
            if not data:
                return
            yield data


hash_file = sha256_file  # the key of a file's content


class BlobStore(ABC):
    """A content-addressed blob store with named mutable objects (local folder or S3)."""

    url: str

    # --- immutable, content-addressed blobs -------------------------------------------------------
    @abstractmethod
    def put_bytes(self, data: bytes | memoryview) -> str:
        """Store ``data``; return its sha256 hex key. An existing blob is not rewritten."""

    @abstractmethod
    def put_file(self, path: str | os.PathLike, move: bool = False) -> str:
        """Store a file's content; with ``move=True`` the file is moved in (or deleted if deduplicated)."""

    @abstractmethod
    def put_stream(self, chunks: Iterable[bytes | memoryview]) -> str:
        """Store the concatenation of ``chunks`` without building it in memory; return its key."""

    @abstractmethod
    def get_bytes(self, key: str) -> bytes:
        """The content of blob ``key`` (StoreError if missing)."""

    @abstractmethod
    def blob_path(self, key: str) -> Path:
        """A local file holding blob ``key``: the blob itself for a local store (mmap-able), a cached
        download for a remote one. Never write to it."""

    @abstractmethod
    def has_blob(self, key: str) -> bool:
        """Whether blob ``key`` is in the store."""

    def verify_blob(self, key: str) -> bool:
        """Re-hash blob ``key`` and say whether its content still matches its key."""
        return hash_file(self.blob_path(key)) == key

    # --- named, mutable objects ---------------------------------------------------------------------
    @abstractmethod
    def write(self, name: str, data: bytes, *, durable: bool = True) -> None:
        """Atomically create or replace the object ``name``. ``durable=False`` skips the fsync (for
        logs and other objects that may be lost in a power cut); readers never see a torn object."""

    @abstractmethod
    def read(self, name: str) -> bytes:
        """The content of object ``name`` (StoreError naming it if missing)."""

    @abstractmethod
    def exists(self, name: str) -> bool:
        """Whether object ``name`` exists."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Sorted names of the objects whose name starts with ``prefix`` (blobs are not listed)."""

    @abstractmethod
    def delete(self, name: str) -> None:
        """Delete object ``name``; deleting a missing object is not an error."""

    @abstractmethod
    def local_path(self, name: str) -> Path | None:
        """The local file of object ``name`` (it may not exist yet), or None for a remote store."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
