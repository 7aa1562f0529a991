"""Task-attempt manifests: the record a task writes to the blob store when an attempt ends.

A manifest is the truth about an attempt (the metadata database is only an index built from them).
It is written atomically as JSON at :func:`manifest_name`; its fields::

    flow, run_id, step, task_id, attempt (int), status ("ok" | "failed"), started_at, finished_at,
    artifacts {name: descriptor}, exception {type, message, traceback} | None,
    logs {"stdout": object name, "stderr": object name}, input_paths [parent task pathspecs],
    foreach_stack [{step, var, index, num_splits, value_repr}], parallel {node_index, num_nodes} | None,
    user, hostname, origin_task (pathspec | None, set when cloned by resume), retry_count, catch_var,
    signature (see stoker.store.signing: manifests and run records are signed, and verified when read)
"""

from __future__ import annotations

import json
from typing import Any

from stoker.errors import StoreError
from stoker.store.blobs import BlobStore
from stoker.store.signing import SIGNATURE, mark_owner, sign, unseal, verify

STATUSES = ("ok", "failed")

_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "flow": str, "run_id": str, "step": str, "task_id": str, "attempt": int, "status": str,
    "started_at": (int, float), "finished_at": (int, float), "artifacts": dict,
}
_DEFAULTS: dict[str, Any] = {
    "exception": None, "logs": {}, "input_paths": [], "foreach_stack": [], "parallel": None,
    "user": None, "hostname": None, "origin_task": None, "retry_count": None, "catch_var": None,
}


def run_prefix(flow: str, run_id: str) -> str:
    """The object-name prefix of everything a run writes: ``runs/{flow}/{run_id}/``."""
    return f"runs/{flow}/{run_id}/"


def attempt_prefix(flow: str, run_id: str, step: str, task_id: str, attempt: int) -> str:
    """``runs/{flow}/{run_id}/{step}/{task_id}/{attempt}/`` (logs and the manifest live here)."""
    return f"runs/{flow}/{run_id}/{step}/{task_id}/{int(attempt)}/"


def manifest_name(flow: str, run_id: str, step: str, task_id: str, attempt: int) -> str:
    """The object name of an attempt's manifest."""
    return attempt_prefix(flow, run_id, step, task_id, attempt) + "manifest.json"


def log_name(flow: str, run_id: str, step: str, task_id: str, attempt: int, stream: str) -> str:
    """The conventional object name of an attempt's log (``stream`` is "stdout" or "stderr"); the
    manifest's ``logs`` field names the actual objects."""
    return attempt_prefix(flow, run_id, step, task_id, attempt) + f"{stream}.log"


def pathspec(flow: str, run_id: str, step: str | None = None, task_id: str | None = None) -> str:
    """``Flow/run_id[/step[/task_id]]``."""
    return "/".join(str(p) for p in (flow, run_id, step, task_id) if p is not None)


def run_record_name(flow: str, run_id: str) -> str:
    """The object name of a run's record (``runs/{flow}/{run_id}/run.json``)."""
    return run_prefix(flow, run_id) + "run.json"


def write_run_record(store: BlobStore, record: dict[str, Any]) -> str:
    """Write a run's record (flow, run_id, user, tags, params, config, origin_run_id, created_at, status,
    finished_at) next to its manifests, so the index can be rebuilt from the store alone."""
    for key in ("flow", "run_id", "user", "params"):
        if key not in record:
            raise StoreError(f"run record lacks the field {key!r}")
    name = run_record_name(record["flow"], record["run_id"])
    signed = sign(store.url, name, record)
    store.write(name, json.dumps(signed, indent=1, sort_keys=True).encode())
    return name


def read_run_record(store: BlobStore, flow: str, run_id: str) -> dict[str, Any] | None:
    """A run's record (its signature verified), or None if the run never wrote one."""
    name = run_record_name(flow, run_id)
    if not store.exists(name):
        return None
    record = verify(store.url, name, _parse(store, name))
    mark_owner(record.get("run_inputs") or {}, record.get("user"), pathspec(flow, run_id))
    return record


def _parse(store: BlobStore, name: str) -> Any:
    try:
        return json.loads(store.read(name))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise StoreError(f"{name} in {store.url} is not valid JSON: {e}") from e


def clone_manifest(manifest: dict[str, Any], *, run_id: str, task_id: str | None = None,
                   user: str | None = None) -> dict[str, Any]:
    """The manifest of a task cloned into run ``run_id`` by ``resume``: same artifacts (their blobs are
    shared, nothing is copied) and logs, ``origin_task`` set to the original task's pathspec."""
    m = validate_manifest(manifest)
    origin = m["origin_task"] or pathspec(m["flow"], m["run_id"], m["step"], m["task_id"])
    return {**m, "run_id": run_id, "task_id": task_id or m["task_id"], "attempt": 0, "retry_count": 0,
            "origin_task": origin, "user": user or m["user"]}


def validate_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """Check a manifest's required fields and fill the optional ones; return a normalized copy."""
    if not isinstance(manifest, dict):
        raise StoreError(f"a manifest must be a dict, got {type(manifest).__name__}")
    where = "/".join(str(manifest.get(k, "?")) for k in ("flow", "run_id", "step", "task_id", "attempt"))
    for key, typ in _REQUIRED.items():
        if key not in manifest:
            raise StoreError(f"manifest {where} lacks the field {key!r}")
        if not isinstance(manifest[key], typ) or isinstance(manifest[key], bool):
            raise StoreError(f"manifest {where}: field {key!r} must be {typ}, got {manifest[key]!r}")
    if manifest["status"] not in STATUSES:
        raise StoreError(f"manifest {where}: status must be one of {STATUSES}, got {manifest['status']!r}")
    out = {**_DEFAULTS, **manifest}
    if out["retry_count"] is None:
        out["retry_count"] = out["attempt"]
    for key in ("flow", "run_id", "step", "task_id"):
        if "/" in out[key] or not out[key]:
            raise StoreError(f"manifest {where}: {key} {out[key]!r} must be non-empty and contain no '/'")
    return out


def write_manifest(store: BlobStore, manifest: dict[str, Any]) -> str:
    """Validate, sign and atomically write an attempt's manifest; return its object name.

    ``manifest`` gets the signature (and its pickled artifacts their owner, see stoker.store.signing) as
    written, so indexing it gives the same rows as indexing the stored copy."""
    return store_manifest(store, manifest)[0]


def store_manifest(store: BlobStore, manifest: dict[str, Any]) -> tuple[str, bytes]:
    """:func:`write_manifest`, also returning the bytes stored (a local member hands them to its scheduler)."""
    m = validate_manifest(manifest)
    name = manifest_name(m["flow"], m["run_id"], m["step"], m["task_id"], m["attempt"])
    mark_owner(m["artifacts"], m["user"], pathspec(m["flow"], m["run_id"]))
    try:
        json.dumps(m, allow_nan=False)
        signed = sign(store.url, name, m)
    except (TypeError, ValueError) as e:
        raise StoreError(f"manifest {name} is not JSON-serializable: {e}") from e
    data = json.dumps(signed, sort_keys=True).encode()
    store.write(name, data)
    manifest[SIGNATURE] = signed[SIGNATURE]
    return name, data


def read_manifest(store: BlobStore, flow: str, run_id: str, step: str, task_id: str,
                  attempt: int) -> dict[str, Any]:
    """Read an attempt's manifest and verify its signature (StoreError if it was never written, or is
    unsigned or forged)."""
    return read_manifest_object(store, manifest_name(flow, run_id, step, task_id, attempt))


def read_manifest_object(store: BlobStore, name: str) -> dict[str, Any]:
    """The manifest stored as object ``name``, its signature verified; each pickled artifact's descriptor
    is marked with the user who wrote it (see stoker.store.signing.check_owner)."""
    m = verify(store.url, name, _parse(store, name))
    if isinstance(m.get("artifacts"), dict):
        mark_owner(m["artifacts"], m.get("user"), pathspec(str(m.get("flow")), str(m.get("run_id"))))
    return m


def artifact_descriptor(store: BlobStore, flow: str, run_id: str, step: str, task_id: str, attempt: int,
                        name: str) -> dict[str, Any]:
    """The descriptor of artifact ``name`` as the attempt's verified manifest in the store gives it (the
    client loads artifacts through this, not through the index, which is not signed)."""
    arts = read_manifest(store, flow, run_id, step, task_id, attempt).get("artifacts") or {}
    if name not in arts:
        raise StoreError(f"the manifest of {pathspec(flow, run_id, step, task_id)} (attempt {attempt}) in "
                         f"{store.url} has no artifact {name!r}: the index is out of date; re-index the run")
    return arts[name]


def latest_manifest(store: BlobStore, flow: str, run_id: str, step: str, task_id: str) -> dict[str, Any]:
    """The manifest of a task's latest finished attempt, found in the store alone (a task on a remote
    node reads its parents' artifacts this way, without the database)."""
    prefix = f"runs/{flow}/{run_id}/{step}/{task_id}/"
    attempts = [int(n[len(prefix):].split("/")[0]) for n in store.list(prefix)
                if n.endswith("/manifest.json") and n[len(prefix):].split("/")[0].isdigit()]
    if not attempts:
        raise StoreError(f"task {pathspec(flow, run_id, step, task_id)} has no manifest in {store.url}: it "
                         f"never finished an attempt")
    return read_manifest(store, flow, run_id, step, task_id, max(attempts))


def list_manifests(store: BlobStore, flow: str, run_id: str) -> list[str]:
    """Object names of every attempt manifest of a run (to rebuild the index from the store)."""
    return [n for n in store.list(run_prefix(flow, run_id)) if n.endswith("/manifest.json")]


class StoredManifest(dict):
    """A manifest with ``text``, the JSON it is stored as (indexing it then costs no serialization)."""

    text: str = ""


def handed_manifest(sealed: bytes, url: str, flow: str, run_id: str, step: str, task_id: str,
                    attempt: int) -> StoredManifest | None:
    """The manifest a local member handed over (runtime/member/handover.py): the bytes it stored, sealed with the
    store's key (signing.seal: an HMAC over the bytes, not the signature's parse and re-serialization), on a socket only
    the run's processes hold. None when they are not this attempt's manifest or were sealed with another key (a
    task that changed its key): the scheduler then reads the manifest from the store and checks it there."""
    data = unseal(url, sealed)
    if data is None:
        return None
    try:
        m = StoredManifest(json.loads(data))
    except (ValueError, TypeError):
        return None
    if (m.get("flow"), m.get("run_id"), m.get("step"), m.get("task_id"), m.get("attempt")) != \
            (flow, run_id, step, task_id, attempt):
        return None
    m.text = data.decode()
    return m


def manifest_outcome(store: BlobStore, name: str) -> tuple[dict | None, str | None]:
    """(manifest, None) for an attempt's verified manifest; (None, None) when it wrote none (killed: the scheduler
    writes one); (None, why) when one is there but cannot be trusted (unsigned, signed with another key, damaged):
    the failure then says so instead of a bare exit code."""
    try:
        return read_manifest_object(store, name), None
    except Exception as e:  # noqa: BLE001 - whatever it is, the attempt failed; say why when a manifest exists
        try:
            exists = store.exists(name)
        except Exception:  # noqa: BLE001
            exists = False
        return None, (str(e) if exists else None)
