"""Signed checkpoint manifests: loading a checkpoint unpickles its ``.metadata`` (DCP's ``FileSystemReader``),
so a manifest's checksums vouch for nothing unless the manifest itself is authentic. Rank 0 signs it when it
commits (HMAC-SHA256 with a store's key, :mod:`stoker.store.signing`); every reader checks the signature
before it trusts a checksum. The key is that of the store the run uses (:func:`key_store_url`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from stoker.errors import CheckpointError, StoreError
from stoker.store import signing
from stoker.store.metrics import ENV_STORE
from stoker.store.paths import default_store_url

SIGNED_AS = "checkpoint/manifest.json"  # the object name a checkpoint manifest's signature covers


def key_store_url() -> str:
    """The store whose signing key signs and verifies checkpoint manifests: the run's store in a flow task and
    its torchrun workers (``$STOKER_METRICS_STORE``, which the task exports to them), else ``$STOKER_STORE``,
    else the default local store (``$STOKER_HOME/store``): a standalone ``stoker.train`` uses that key wherever
    its ``checkpoint.dir`` is. Normalized as the store itself names it, so the key file is the same one."""
    url = os.environ.get(ENV_STORE) or default_store_url()
    url = url[len("file://"):] if url.startswith("file://") else url
    if url.startswith("s3://"):
        bucket, _, prefix = url[len("s3://"):].partition("/")
        return f"s3://{bucket}/{prefix.strip('/')}" if prefix.strip("/") else f"s3://{bucket}"
    return url if "://" in url else str(Path(url).expanduser().resolve())


def sign_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """``manifest`` signed with the key of :func:`key_store_url` (CheckpointError naming the fix without one)."""
    url = key_store_url()
    try:
        if not os.environ.get(ENV_STORE) and "://" not in url:  # a standalone run on a local store makes its key
            signing.store_key(url, create=True)
        return signing.sign(url, SIGNED_AS, signing.finite_json(manifest))
    except StoreError as e:
        raise CheckpointError(f"cannot sign the checkpoint manifest with the key of the store {url}: "
                              f"{e}") from None


def check_signature(manifest: dict[str, Any], where: str) -> None:
    """Refuse (CheckpointError, one line naming ``where`` and the fix) a manifest that is unsigned (unless
    ``STOKER_TRUST_UNSIGNED=1``) or not signed with the key of :func:`key_store_url`."""
    url = key_store_url()
    try:
        signing.store_key(url)
    except StoreError as e:
        raise CheckpointError(f"cannot verify {where}: {e}") from None
    try:
        signing.verify(url, SIGNED_AS, manifest)
    except StoreError:
        if manifest.get(signing.SIGNATURE) is None:
            raise CheckpointError(
                f"{where} is not signed (written before stoker signed checkpoints, or by someone without the key "
                f"of the store {url}): it is not loaded, since loading unpickles its files. Use another "
                f"checkpoint, or set {signing.UNSIGNED_ENV}=1 if you trust everyone who can write it") from None
        raise CheckpointError(
            f"{where} has a bad signature: it was changed after it was written, or signed with another key than "
            f"the one of the store {url} ({_key_source(url)}; every machine and rank needs the same, see "
            f"docs/store.md, 'Security'); use another checkpoint") from None


def _key_source(url: str) -> str:
    if os.environ.get(signing.KEY_ENV):
        return f"${signing.KEY_ENV}"
    if os.environ.get(signing.SECRET_ENV):
        return f"the secret ${signing.SECRET_ENV}"
    return f"the key file {signing.key_path(url)}"
