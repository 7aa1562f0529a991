"""Signed checkpoint manifests: loading a checkpoint unpickles its ``.metadata`` (DCP's ``FileSystemReader``),
so a manifest's checksums vouch for nothing unless the manifest itself is authentic. Rank 0 signs it when it
commits (HMAC-SHA256 with a store's key, :mod:`stoker.store.signing`); every reader checks the signature
before it trusts a checksum. The key is that of the store the run uses (:func:`key_store_url`).
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path
from typing import Any

from stoker.errors import CheckpointError, StoreError
from stoker.store import signing
from stoker.store.metrics import ENV_STORE
from stoker.store.paths import default_store_url

SIGNED_AS = "checkpoint/manifest.json"  # the object name a checkpoint manifest's signature covers
STORE_ENV, HOME_ENV = "STOKER_STORE", "STOKER_HOME"  # what chooses the default store (stoker.store.paths)


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


KEY_HINT = "the signing key in use"  # in every refusal whose cause is the key, not the checkpoint (find() says so)


def check_signature(manifest: dict[str, Any], where: str) -> None:
    """Refuse (CheckpointError, one line naming ``where`` and the fix) a manifest that is unsigned (unless
    ``STOKER_TRUST_UNSIGNED=1``) or not signed with the key of :func:`key_store_url`. When the cause is the key (none
    here, or another store's: a checkpoint written under another STOKER_HOME), the message says so, names the key
    in use and where it comes from, and the fix."""
    url = key_store_url()
    try:
        signing.store_key(url)
    except StoreError as e:
        missing = _key_source(url).startswith("the key file") and not signing.key_path(url).exists()
        why = "there is none here" if missing else str(e)
        raise CheckpointError(f"cannot verify {where} with {KEY_HINT}, {key_in_use(url)}: {why}; {_home_fix()}, "
                              f"or copy the key file from the machine that trained it") from None
    try:
        signing.verify(url, SIGNED_AS, manifest)
    except StoreError:
        if manifest.get(signing.SIGNATURE) is None:
            raise CheckpointError(
                f"{where} is not signed (written before stoker signed checkpoints, or by someone without the key "
                f"of the store {url}): it is not loaded, since loading unpickles its files. Use another "
                f"checkpoint, or set {signing.UNSIGNED_ENV}=1 if you trust everyone who can write it") from None
        other = _verifying_key_file(manifest, url)
        if other is not None:
            raise CheckpointError(
                f"{where} has a bad signature for {KEY_HINT}, {key_in_use(url)}: it is signed with another "
                f"store's key (the key file {other} verifies it), so it was written under another STOKER_HOME or "
                f"store, not damaged; {_home_fix()}") from None
        raise CheckpointError(
            f"{where} has a bad signature for {KEY_HINT}, {key_in_use(url)}: it was changed after it was written, "
            f"or signed with a key this machine does not have (every machine and rank needs the same, see "
            f"docs/store.md, 'Security'); {_home_fix()}; else use another checkpoint") from None


def key_in_use(url: str) -> str:
    """Which key verifies checkpoints here and why: the store it belongs to, the setting that chose that store, and
    where the key itself comes from."""
    if os.environ.get(ENV_STORE):
        chosen = f"${ENV_STORE}, the run's store"
    elif os.environ.get(STORE_ENV):
        chosen = f"${STORE_ENV}"
    elif os.environ.get(HOME_ENV):
        chosen = f"${HOME_ENV}"
    else:
        chosen = "the default STOKER_HOME ./.stoker of the current folder"
    return f"the key of the store {url} ({chosen}; {_key_source(url)})"


def _home_fix() -> str:
    if os.environ.get(ENV_STORE) or os.environ.get(STORE_ENV) or os.environ.get(HOME_ENV):
        return f"read it with the {HOME_ENV} (or {STORE_ENV}, or {signing.KEY_ENV}) it was written with"
    return (f"the default {HOME_ENV} follows the current folder: run from the folder it was trained from, or set "
            f"{HOME_ENV} to that folder's .stoker")


def _verifying_key_file(manifest: dict[str, Any], url: str) -> Path | None:
    """Another key file on this machine whose key verifies ``manifest`` (a diagnosis only: never accepted)."""
    try:
        files = sorted(p for p in signing.key_dir().iterdir() if p.is_file() and not p.suffix)
    except OSError:
        return None
    for path in files:
        try:
            key = path.read_bytes().strip()
        except OSError:
            continue
        if key and hmac.compare_digest(str(manifest.get(signing.SIGNATURE)), signing._mac(key, SIGNED_AS, manifest)):
            return path
    return None


def _key_source(url: str) -> str:
    if os.environ.get(signing.KEY_ENV):
        return f"${signing.KEY_ENV}"
    if os.environ.get(signing.SECRET_ENV):
        return f"the secret ${signing.SECRET_ENV}"
    return f"the key file {signing.key_path(url)}"
