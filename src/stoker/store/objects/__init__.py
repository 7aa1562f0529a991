"""The one object-store layer, the only code that reads and writes storage: every package (blob store,
datasets, corpora, checkpoints) reaches local folders, ``s3://`` (AWS, MinIO, any S3 API) and other fsspec
URLs (``gs://``, ``az://``, ``memory://``) through :func:`open_objects` and the :class:`ObjectStore` interface.

- Keys are ``/``-separated names relative to the store's root URL (``s3://bucket/prefix``).
- Large objects move as parallel parts: multipart uploads and ranged downloads, ``part_size`` bytes
  each, ``concurrency`` at a time (:class:`TransferConfig`, from ``$STOKER_S3_*``). Many small objects
  move on a thread pool (:meth:`ObjectStore.put_many`, :meth:`ObjectStore.get_many`).
- A download given the sha256 recorded for it is verified; a mismatch deletes the file and raises.
- Every failure is one error of the class the caller names (``StoreError`` by default, ``DataError``
  for datasets ...) saying what failed and how to fix it.

Configuration (environment; see docs/store.md)::

    STOKER_S3_ENDPOINT_URL      S3-compatible server (MinIO, moto ...); default: AWS
    STOKER_S3_REGION            region (default: boto3's own resolution)
    STOKER_S3_PROFILE           AWS profile of the credentials (default: boto3's chain)
    STOKER_S3_CONCURRENCY       parallel parts / objects per transfer (default 16)
    STOKER_S3_PART_SIZE         bytes per part (default 16MiB; suffixes KiB MiB GiB)
    STOKER_S3_MULTIPART_THRESHOLD  objects at least this big go in parts (default = part size)
    STOKER_S3_MAX_ATTEMPTS      attempts per request (default 3)
    STOKER_S3_READ_TIMEOUT      seconds (default 120)
"""

from __future__ import annotations

import os
from typing import Any

from stoker.errors import StokerError, StoreError
from stoker.store.objects.base import (  # noqa: F401  (the layer's public names)
    BufferedUpload,
    MiB,
    ObjectInfo,
    ObjectStore,
    TransferConfig,
    Upload,
    check_object_key,
    parse_bytes,
)
from stoker.store.objects.fsspec_store import FsspecObjects, fsspec_filesystem  # noqa: F401
from stoker.store.objects.local import LocalObjects  # noqa: F401
from stoker.store.objects.s3 import S3Objects, s3_client  # noqa: F401


def open_objects(url: str | os.PathLike, *, error: type[StokerError] = StoreError, client: Any = None,
                 config: TransferConfig | None = None) -> ObjectStore:
    """The object store at ``url``: a folder (or ``file://``), ``s3://bucket/prefix`` (boto3; ``client`` may
    be given), or any other fsspec URL (``gs://``, ``az://``, ``memory://`` ...; its driver installed)."""
    url = os.fspath(url)
    config = config or TransferConfig.from_env()
    if url.startswith("s3://"):
        return S3Objects.from_url(url, error=error, client=client, config=config)
    if "://" in url and not url.startswith("file://"):
        return FsspecObjects(url, error=error, config=config)
    return LocalObjects(url, error=error, config=config)


def is_remote(url: str) -> bool:
    """True for URLs other than local paths and ``file://`` (``s3://``, ``gs://``, ``memory://`` ...)."""
    return "://" in url and not url.startswith("file://")
