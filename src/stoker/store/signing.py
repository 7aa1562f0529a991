"""Signed store documents and the artifact trust policy.

Artifacts are unpickled from the store, so whoever can write the store can run code in every process that
reads it. Task manifests and run records (the documents that name artifacts) are therefore signed with a
per-store secret key (HMAC-SHA256 over the object's name and its canonical JSON), and verified before any
artifact they name is loaded. Blobs are content-addressed and the pickle bodies' hashes are checked on read,
so a verified manifest authenticates the pickle it names.

The key never lives in the store (anyone who can write the store could read or replace it):

- ``$STOKER_STORE_KEY`` (any string), else
- the AWS Secrets Manager secret named by ``$STOKER_STORE_KEY_SECRET`` (ARN or name; how Batch nodes get it), else
- the key file ``$STOKER_KEY_DIR/<sha256(store url)[:16]>`` (default folder ``~/.config/stoker/keys``),
  created with mode 0600 on the first run in a local store (or by ``start_run`` for any store), else
- the secret named in ``<that key file>.secret`` (written by ``stoker infra apply`` for its store).

``STOKER_TRUST_UNSIGNED=1`` accepts unsigned documents (written before signing existed). The trust policy
(``STOKER_TRUST=all|self``, ``STOKER_TRUST_USERS=alice,bob``) decides whose pickled artifacts are loaded.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any

from stoker.errors import ConfigError, StoreError
from stoker.store.paths import current_user

SIGNATURE = "signature"  # the field of a signed document that holds its signature
_SCHEME = "hmac-sha256:"
KEY_ENV = "STOKER_STORE_KEY"
KEY_DIR_ENV = "STOKER_KEY_DIR"
SECRET_ENV = "STOKER_STORE_KEY_SECRET"  # a Secrets Manager secret (ARN or name) holding the key
UNSIGNED_ENV = "STOKER_TRUST_UNSIGNED"
TRUST_ENV = "STOKER_TRUST"
TRUST_USERS_ENV = "STOKER_TRUST_USERS"
OWNER = "owner"  # the field a verified reader adds to a pickled artifact's descriptor: who wrote it
OWNER_RUN = "owner_run"  # ... and in which run

_cache: dict[tuple[str, str], bytes] = {}
_by_url: dict[tuple[str | None, str | None, str], bytes] = {}  # ($STOKER_KEY_DIR, $HOME, store url) -> key
_secrets: dict[str, bytes] = {}  # secret id -> key: one GetSecretValue call per process


def key_dir() -> Path:
    """Where key files live: ``$STOKER_KEY_DIR`` or ``~/.config/stoker/keys`` (never inside a store)."""
    return Path(os.environ.get(KEY_DIR_ENV) or Path.home() / ".config" / "stoker" / "keys").expanduser()


def key_path(url: str) -> Path:
    """The key file of the store at ``url``."""
    return key_dir() / hashlib.sha256(url.encode()).hexdigest()[:16]


def store_key(url: str, *, create: bool = False) -> bytes:
    """The signing key of the store at ``url``. ``create``: make the key file when there is none -- only the
    machine that starts runs does (``start_run``; a standalone ``stoker.train`` for its checkpoints). Anywhere else
    a missing key is an error naming the fix: a node or teammate that made its own key would sign what no one
    else can verify."""
    env = os.environ.get(KEY_ENV)
    if env:
        return env.encode()
    secret = os.environ.get(SECRET_ENV)
    if secret:
        return secret_key(secret)
    where = (os.environ.get(KEY_DIR_ENV), os.environ.get("HOME"), url)  # what key_path(url) depends on
    fast = _by_url.get(where)  # (working out the path for every manifest costs more than the HMAC)
    if fast is not None:
        return fast
    path = key_path(url)
    cached = _cache.get((str(path), url))
    if cached is not None:
        return cached
    if not path.exists():
        pointer = secret_pointer(url)
        if pointer:
            return secret_key(pointer)
        if not create:
            raise StoreError(f"no signing key for the store {url}: set {KEY_ENV}, or {SECRET_ENV} to the AWS "
                             f"Secrets Manager secret holding it (`stoker infra apply` creates one and points this "
                             f"machine at it), or copy the key file {path} from the machine that started runs in "
                             f"this store (see docs/store.md, 'Security')")
        _create_key(path)
    try:
        key = path.read_bytes().strip()
    except OSError as e:
        raise StoreError(f"cannot read the signing key {path} of the store {url}: {e}; fix its permissions "
                         f"(it must be readable by you only) or set {KEY_ENV}") from e
    if not key:
        raise StoreError(f"the signing key file {path} of the store {url} is empty: delete it (a new key makes "
                         f"existing runs unreadable) or copy the right one there")
    _cache[(str(path), url)] = key
    _by_url[where] = key
    return key


def local_key(url: str) -> tuple[bytes, str] | None:
    """(key, where it comes from) of the store at ``url`` as this machine has it without asking AWS: from
    ``$STOKER_STORE_KEY`` or the key file; None when neither exists (what `stoker infra apply` uploads)."""
    env = os.environ.get(KEY_ENV)
    if env:
        return env.encode(), f"${KEY_ENV}"
    path = key_path(url)
    try:
        key = path.read_bytes().strip()
    except OSError:
        return None
    return (key, f"the key file {path}") if key else None


def _pointer_path(url: str) -> Path:
    return key_path(url).with_suffix(".secret")


def secret_pointer(url: str) -> str | None:
    """The secret (ARN) `stoker infra apply` recorded as holding the key of the store at ``url``, if any."""
    try:
        return _pointer_path(url).read_text().strip() or None
    except OSError:
        return None


def remember_secret(url: str, secret: str | None) -> None:
    """Record (or with None forget) the secret that holds the key of the store at ``url``, for this machine."""
    path = _pointer_path(url)
    if secret is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(secret + "\n")
    os.replace(tmp, path)


def secret_key(secret: str) -> bytes:
    """The key held by the AWS Secrets Manager secret ``secret`` (ARN or name), read once per process. boto3 is
    imported only here; its usual settings apply (credentials, ``$AWS_ENDPOINT_URL``); the region is the ARN's."""
    cached = _secrets.get(secret)
    if cached is not None:
        return cached
    fix = (f"give this machine's AWS identity (on Batch: the job role, which `stoker infra apply` sets up) "
           f"secretsmanager:GetSecretValue on it, or fix {SECRET_ENV}")
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise StoreError(f"the store's signing key is in the AWS Secrets Manager secret {secret}, and reading it "
                         f"needs boto3: pip install 'stoker[aws]'") from None
    parts = secret.split(":")
    region = parts[3] if secret.startswith("arn:") and len(parts) >= 7 else None
    config = Config(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=10, read_timeout=30)
    try:
        got = boto3.client("secretsmanager", region_name=region or None, config=config).get_secret_value(
            SecretId=secret)
    except Exception as e:  # noqa: BLE001 - every failure gets the same fix, with AWS's own words
        err = (getattr(e, "response", None) or {}).get("Error", {})
        why = f"{err.get('Code')}: {err.get('Message')}" if err else f"{type(e).__name__}: {e}"
        raise StoreError(f"cannot read the store's signing key from the AWS Secrets Manager secret {secret} "
                         f"({why}): {fix}") from e
    key = (got.get("SecretString") or "").strip().encode()
    if not key:
        raise StoreError(f"the AWS Secrets Manager secret {secret} holds no signing key (empty, or binary): "
                         f"put the store's key in it as a string, or fix {SECRET_ENV}")
    _secrets[secret] = key
    return key


def _create_key(path: Path) -> None:
    """Write a random key to ``path`` (0600) unless another process won the race to create it."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".new-")  # 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # fails if it exists: the first writer's key wins
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)


def finite_json(v: Any) -> Any:
    """``v`` with NaN and infinite floats as strings ('nan', 'inf'): signed documents are strict JSON, and a
    config or a checkpoint's settings may hold them (the run itself keeps the real values)."""
    if isinstance(v, float) and not math.isfinite(v):
        return repr(v)
    if isinstance(v, dict):
        return {k: finite_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [finite_json(x) for x in v]
    return v


def canonical(doc: dict[str, Any]) -> bytes:
    """The bytes a signature covers: sorted-key compact JSON, without the signature field."""
    body = {k: v for k, v in doc.items() if k != SIGNATURE}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False, default=str).encode()


def _mac(key: bytes, name: str, doc: dict[str, Any]) -> str:
    return _SCHEME + hmac.new(key, name.encode() + b"\n" + canonical(doc), hashlib.sha256).hexdigest()


def sign(url: str, name: str, doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` (JSON-normalized) with its signature for object ``name`` of the store at ``url``."""
    plain = json.loads(canonical(doc))  # what a reader will parse: tuples become lists, default=str applied
    plain[SIGNATURE] = _mac(store_key(url), name, plain)
    return plain


def seal(url: str, data: bytes) -> bytes:
    """``data`` with an HMAC over its bytes (a local member's manifest on its way to the scheduler): cheap to check,
    where a signature needs the document parsed and serialized again."""
    return hmac.new(store_key(url), data, hashlib.sha256).hexdigest().encode() + b"\n" + data


def unseal(url: str, sealed: bytes) -> bytes | None:
    """The data :func:`seal` sealed with this store's key; None when it was sealed with another key, or is torn."""
    tag, _, data = sealed.partition(b"\n")
    good = hmac.new(store_key(url), data, hashlib.sha256).hexdigest().encode()
    return data if hmac.compare_digest(tag, good) else None


def verify(url: str, name: str, doc: dict[str, Any]) -> dict[str, Any]:
    """Check the signature of ``doc`` read from object ``name``; return it. Raise StoreError naming the
    object and the fix when it is unsigned (unless ``STOKER_TRUST_UNSIGNED=1``) or its signature is wrong."""
    sig = doc.get(SIGNATURE) if isinstance(doc, dict) else None
    if sig is None:
        if os.environ.get(UNSIGNED_ENV, "") in ("1", "true", "yes"):
            return doc
        raise StoreError(f"{name} in the store {url} is not signed (written before stoker signed manifests, "
                         "or by someone "
                         f"without the store's key): its artifacts are not loaded. If you trust everyone who can "
                         f"write this store, set {UNSIGNED_ENV}=1 to accept unsigned runs")
    if not isinstance(sig, str) or not hmac.compare_digest(sig, _mac(store_key(url), name, doc)):
        raise StoreError(f"{name} in the store {url} has a bad signature: it was changed after it was written, or "
                         f"it was signed with another key. Every machine that uses this store needs the same key "
                         f"(${KEY_ENV}, ${SECRET_ENV}, or the file {key_path(url)}); see docs/store.md, 'Security'")
    return doc


# --- whose pickles are loaded ----------------------------------------------------------------------------
def trusted_users() -> set[str] | None:
    """Users whose pickled artifacts are loaded: None means everyone (the default, ``STOKER_TRUST=all``)."""
    extra = {u.strip() for u in os.environ.get(TRUST_USERS_ENV, "").split(",") if u.strip()}
    mode = (os.environ.get(TRUST_ENV) or ("self" if extra else "all")).strip().lower()
    if mode == "all":
        return None
    if mode != "self":
        raise ConfigError(f"{TRUST_ENV}={mode!r}: use 'all' (load every run's artifacts) or 'self' (only yours, "
                          f"plus the users in {TRUST_USERS_ENV}=alice,bob)")
    return {current_user(), *extra}


def mark_owner(artifacts: dict[str, Any], user: str | None, run: str) -> None:
    """Record in each pickled artifact's descriptor who wrote it, in which run (kept when the descriptor is
    copied into a later task's or a resumed run's manifest), for :func:`check_owner`."""
    for desc in artifacts.values():
        if isinstance(desc, dict) and desc.get("kind") == "pickle" and not desc.get(OWNER):
            desc[OWNER], desc[OWNER_RUN] = user or "unknown", run


def check_owner(desc: dict[str, Any]) -> None:
    """Refuse to unpickle an artifact written by a user outside the trust policy."""
    users = trusted_users()
    owner = desc.get(OWNER)
    if users is None or owner is None or owner in users:
        return
    raise StoreError(f"an artifact of run {desc.get(OWNER_RUN, '?')} was written by user {owner!r}, and only "
                     f"{', '.join(sorted(users))}'s pickled artifacts are loaded ({TRUST_ENV}). To load it, set "
                     f"{TRUST_USERS_ENV}={','.join(sorted(users | {owner}))} or {TRUST_ENV}=all")
