"""Client namespaces (as in Metaflow), the client's errors, and where the client reads from by default.

Every run is tagged ``user:<name>``. The client only shows runs carrying the current namespace's tag:
``user:$USER`` by default, any tag with ``namespace("team:nlp")``, everything with ``namespace(None)``.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from stoker.errors import StoreError
from stoker.store.blobs import BlobStore, open_store
from stoker.store.metadata import MetadataDB
from stoker.store.paths import current_user, default_db_path, default_store_url

_UNSET = object()
_namespace: object = _UNSET
_lock = threading.Lock()
_dbs: dict[tuple[Path, int], MetadataDB] = {}  # (path, pid) -> its connection
_stores: dict[str, BlobStore] = {}


class NotFound(StoreError, KeyError):
    """A flow, run, step, task or artifact does not exist (also a KeyError, as for ``run["nostep"]``)."""

    def __str__(self) -> str:
        return Exception.__str__(self)


class NamespaceMismatch(StoreError):
    """The object exists but is outside the current namespace."""


# Metaflow's names, so that `except MetaflowNotFound` keeps working after changing the import line.
MetaflowNotFound = NotFound
MetaflowNamespaceMismatch = NamespaceMismatch


def namespace(ns: str | None) -> str | None:
    """Switch the client's namespace: a tag such as ``user:alice`` or ``team:nlp``, or None for all runs.
    Returns the namespace set."""
    global _namespace
    if ns is not None and (not isinstance(ns, str) or not ns):
        raise StoreError(f"namespace {ns!r} must be a tag like 'user:alice', or None for the global namespace")
    _namespace = ns
    return ns


def default_namespace() -> str:
    """Reset the namespace to ``user:<current user>`` and return it."""
    global _namespace
    _namespace = f"user:{current_user()}"
    return _namespace


def get_namespace() -> str | None:
    """The current namespace (``user:<current user>`` unless changed; None means global)."""
    if _namespace is _UNSET:
        return f"user:{current_user()}"
    return _namespace  # type: ignore[return-value]


def default_db() -> MetadataDB:
    """The metadata index at the default location (one connection per path and process, reused: a forked task
    must not use its parent's SQLite connection)."""
    key = (default_db_path(), os.getpid())
    with _lock:
        if key not in _dbs:
            _dbs[key] = MetadataDB(key[0])
        return _dbs[key]


def default_store() -> BlobStore:
    """The blob store at the default location (one per URL, reused)."""
    url = default_store_url()
    with _lock:
        if url not in _stores:
            _stores[url] = open_store(url)
        return _stores[url]


def check_namespace(pathspec: str, tags: tuple[str, ...] | list[str]) -> None:
    """Raise NamespaceMismatch unless an object with these run tags is visible in the current namespace."""
    ns = get_namespace()
    if ns is not None and ns not in tags:
        owners = ", ".join(t for t in tags if t.startswith("user:")) or "no user tag"
        raise NamespaceMismatch(
            f"{pathspec} is not in the current namespace {ns!r} (it belongs to {owners}). Switch with "
            f"namespace('{next((t for t in tags if t.startswith('user:')), 'user:<name>')}') or see "
            f"every run with namespace(None)"
        )
