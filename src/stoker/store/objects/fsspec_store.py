"""Object stores reached through fsspec: ``gs://`` (gcsfs), ``az://`` / ``abfs://`` (adlfs), ``memory://``
and any other fsspec protocol whose driver is installed. ``s3://`` never comes here (boto3 serves it, see
:mod:`stoker.store.objects.s3`). The only place stoker makes an fsspec filesystem (:func:`fsspec_filesystem`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from stoker._hashing import SHA256
from stoker.errors import StokerError, StoreError
from stoker.store.objects.base import ObjectInfo, ObjectStore, TransferConfig, check_object_key


def fsspec_filesystem(url: str, error: type[StokerError] = StoreError, **options: Any) -> tuple[Any, str]:
    """(fsspec filesystem, path within it) of ``url``; ``error`` naming the driver to install."""
    try:
        import fsspec

        return fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:
        raise error(f"{url}: the filesystem driver is not installed ({exc}); install it (gcsfs for gs://, "
                    "adlfs for az://)") from None
    except ValueError as exc:
        raise error(f"{url}: not a usable fsspec URL ({exc})") from None


class FsspecObjects(ObjectStore):
    """Objects under an fsspec URL. Parallelism is the driver's own (gcsfs and adlfs batch and split large
    transfers); stoker adds the thread pool for many objects, verification and its error messages."""

    def __init__(self, url: str, *, error: type[StokerError] = StoreError, config: TransferConfig | None = None,
                 fs: Any = None) -> None:
        self.url = url.rstrip("/")
        self.error = error
        self.config = config or TransferConfig.from_env()
        if fs is None:
            fs, path = fsspec_filesystem(self.url, error, **self.config.extra)
        else:
            path = url.split("://", 1)[-1]
        self.fs, self.root = fs, path.rstrip("/")

    def path(self, key: str) -> str:
        check_object_key(key, self.error)
        return f"{self.root}/{key}" if key else self.root

    @contextlib.contextmanager
    def _errors(self, what: str, key: str) -> Iterator[None]:
        try:
            yield
        except StokerError:
            raise
        except FileNotFoundError:
            raise self.missing(key) from None
        except Exception as e:  # drivers raise their own classes
            raise self.error(f"{self.url_of(key)}: {what} failed ({type(e).__name__}: {e}); check the URL and "
                             "your credentials for it") from None

    def put_bytes(self, key: str, data: bytes | memoryview, *, durable: bool = False,
                  readonly: bool = False) -> None:
        with self._errors("writing", key):
            self.fs.pipe_file(self.path(key), bytes(data))

    def try_get_bytes(self, key: str) -> bytes | None:
        try:
            with self._errors("reading", key):
                return self.fs.cat_file(self.path(key))
        except self.error:
            if self.size(key) is None:
                return None
            raise

    def get_range(self, key: str, start: int, length: int) -> bytes:
        with self._errors("reading", key):
            return self.fs.cat_file(self.path(key), start=start, end=start + length)

    def put_file(self, key: str, path: str | os.PathLike, *, durable: bool = False,
                 readonly: bool = False) -> None:
        dest = self.path(key)
        with self._errors("uploading", key):
            if "/" in dest:
                self.fs.makedirs(dest.rsplit("/", 1)[0], exist_ok=True)
            self.fs.put_file(os.fspath(path), dest)

    def _download(self, key: str, dest: str, *, hashed: bool = False, algo: str = SHA256) -> str | None:
        with self._errors("downloading", key):
            self.fs.get_file(self.path(key), dest)
        return None

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        full = self.path(prefix) if prefix else self.root
        folder = full if full.endswith("/") or not prefix else full.rsplit("/", 1)[0]
        self.fs.invalidate_cache()  # other processes wrote here since this one last listed
        try:
            found = self.fs.find(folder, detail=True)
        except FileNotFoundError:
            return []
        except Exception as e:  # the driver's own errors (permissions, network)
            raise self.error(f"{self.url_of(prefix)}: listing failed ({type(e).__name__}: {e}); check the URL and "
                             "your credentials for it") from None
        out = []
        for p, info in found.items():
            rel = p[len(self.root):].lstrip("/") if p.startswith(self.root) else None
            if rel is not None and rel.startswith(prefix) and info.get("type", "file") != "directory":
                out.append(ObjectInfo(rel, int(info.get("size") or 0),
                                      str(info.get("ETag") or info.get("mtime") or info.get("created") or "")))
        return sorted(out, key=lambda o: o.key)

    def size(self, key: str) -> int | None:
        try:
            info = self.fs.info(self.path(key))
        except FileNotFoundError:
            return None
        except Exception as e:
            raise self.error(f"{self.url_of(key)}: checking failed ({type(e).__name__}: {e}); check the URL and "
                             "your credentials for it") from None
        return None if info.get("type") == "directory" else int(info.get("size") or 0)

    def delete(self, key: str) -> None:
        if self.size(key) is None:
            return
        with self._errors("deleting", key):
            try:
                self.fs.rm_file(self.path(key))
            except FileNotFoundError:
                pass
