"""Task-attempt manifests: the record a task writes to the blob store when an attempt ends.

A manifest is the truth about an attempt (the metadata database is only an index built from them).
It is written atomically as JSON at :func:`manifest_name`. :class:`Manifest` is its schema, one field a key, and
the one place one is built (the task's own, and the scheduler's for an attempt that wrote none, could not start, or
was cloned by resume); :meth:`Manifest.to_dict` is the JSON stored and signed (stoker.store.signing: manifests and
run records are signed, and verified when read). Readers (the index, the client, the UI) read the dicts.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, field, fields, replace
from typing import Any

from stoker.errors import StoreError
from stoker.store.blobs import BlobStore
from stoker.store.signing import SIGNATURE, mark_owner, sign, unseal, verify

STATUSES = ("ok", "failed")
FRAME_KEYS = ("step", "var", "index", "num_splits", "desc")  # a foreach_stack frame's keys

_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "flow": str, "run_id": str, "step": str, "task_id": str, "attempt": int, "status": str,
    "started_at": (int, float), "finished_at": (int, float), "artifacts": dict,
}
_WHEN_SET = ("iteration", "next", "timings", "python_version", SIGNATURE)  # keys stored only when set (not None)


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


def exception_record(type_: str, message: str, traceback: str = "", **flags: Any) -> dict[str, Any]:
    """A manifest's ``exception``: {type, message, traceback}, plus ``permanent`` (never retried) or ``preempted``
    and ``resume_step`` (run again, resuming) when the failure says so (stoker.runtime.driver.failures reads them).
    The scheduler adds ``cause`` (user, config, oom, node, network, preemption, time_limit, data, stoker, cancelled)
    and ``evidence`` (one line) to every failed attempt's (:meth:`Manifest.with_cause`; older manifests lack them)."""
    return {"type": type_, "message": message, "traceback": traceback, **flags}


@dataclass(kw_only=True)
class Manifest:
    """One task attempt's manifest. Built with :meth:`begin` (an attempt that starts), :meth:`from_dict` (one read or
    handed over), :meth:`failed` and :meth:`cloned`; checked whenever it is built and again when it is stored.

    A hook sees the task's own as ``ctx.manifest`` and may read and set its keys as a dict's (``m["catch_var"]``);
    a key that is not a field is kept in ``extra`` and stored as it is."""

    flow: str  # the flow's name
    run_id: str  # the run's id
    step: str  # the step's name
    task_id: str  # the task's id in its run
    attempt: int  # which attempt of the task, from 0
    status: str  # "ok" | "failed"
    started_at: float  # when the attempt started (epoch seconds)
    finished_at: float  # when it ended (epoch seconds)
    artifacts: dict[str, dict]  # artifact name -> its descriptor (stoker.store.artifacts)
    exception: dict[str, Any] | None = None  # why it failed (exception_record, with cause and evidence); None if not
    logs: dict[str, str] = field(default_factory=dict)  # {"stdout": object name, "stderr": object name}
    input_paths: list[str] = field(default_factory=list)  # the pathspecs of the parent tasks
    foreach_stack: list[dict] = field(default_factory=list)  # frames {step, var, index, num_splits, desc}
    iteration: list[int] | None = None  # passes of the enclosing recursive switches (stored only when set)
    parallel: dict[str, int] | None = None  # {node_index, num_nodes} of a gang's node; None outside a gang
    user: str | None = None  # who ran it
    hostname: str | None = None  # where it ran (the scheduler's host for an attempt that wrote none)
    origin_task: str | None = None  # the pathspec of the task it was cloned from by resume; None when it ran
    retry_count: int | None = None  # Metaflow's name for the attempt (== attempt; 0 for a clone)
    catch_var: str | None = None  # the artifact @catch put the exception in, when @catch handled a failure
    next: dict[str, Any] | None = None  # self.next()'s choice {steps, condition?, foreach_var?, num_splits?, ...}
    timings: dict[str, float] | None = None  # start-up phase -> seconds (stoker.store.goodput; stored when set)
    python_version: str | None = None  # the task's Python ("3.11.7", Metaflow's metadata); stored when set
    signature: str | None = None  # set when it is stored (stoker.store.signing)
    extra: dict[str, Any] = field(default_factory=dict)  # keys this version does not know, kept as they are

    def __post_init__(self) -> None:
        self.validate()
        if self.retry_count is None:
            self.retry_count = self.attempt

    def validate(self) -> None:
        """StoreError unless the required fields have their types, the status is known and the names are paths'."""
        where = "/".join(str(getattr(self, k)) for k in ("flow", "run_id", "step", "task_id", "attempt"))
        for key, typ in _REQUIRED.items():
            value = getattr(self, key)
            if not isinstance(value, typ) or isinstance(value, bool):
                raise StoreError(f"manifest {where}: field {key!r} must be {typ}, got {value!r}")
        if self.status not in STATUSES:
            raise StoreError(f"manifest {where}: status must be one of {STATUSES}, got {self.status!r}")
        for key in ("flow", "run_id", "step", "task_id"):
            if "/" in getattr(self, key) or not getattr(self, key):
                raise StoreError(f"manifest {where}: {key} {getattr(self, key)!r} must be non-empty and contain no '/'")
        if self.extra and not _FIELDS.isdisjoint(self.extra):
            raise StoreError(f"manifest {where}: extra keys {sorted(_FIELDS & set(self.extra))} are fields")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Manifest:
        """The manifest a dict holds (stored, handed over, or built by older code or a test): the required keys
        checked, the optional ones filled (``retry_count`` defaults to ``attempt``), unknown ones kept in ``extra``."""
        if not isinstance(d, dict):
            raise StoreError(f"a manifest must be a dict, got {type(d).__name__}")
        for key in _REQUIRED:
            if key not in d:
                where = "/".join(str(d.get(k, "?")) for k in ("flow", "run_id", "step", "task_id", "attempt"))
                raise StoreError(f"manifest {where} lacks the field {key!r}")
        known = {k: v for k, v in d.items() if k in _FIELDS}
        return cls(**known, extra={k: v for k, v in d.items() if k not in _FIELDS})

    def to_dict(self) -> dict[str, Any]:
        """The manifest as JSON stores it (a shallow copy: its artifacts are this manifest's)."""
        out = {k: getattr(self, k) for k in _ALWAYS}
        for key in _WHEN_SET:
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        out.update(self.extra)
        return out

    @classmethod
    def begin(cls, *, flow: str, run_id: str, step: str, task_id: str, attempt: int, started_at: float,
              user: str | None, input_paths: list[str], foreach: list[dict], iteration: list[int],
              parallel: dict[str, Any] | None, python_version: str | None = None) -> Manifest:
        """The manifest of an attempt that starts at ``started_at``: failed, without artifacts, until the attempt
        says otherwise (:meth:`finish`). ``foreach`` frames and ``parallel`` are the task spec's; a task gives its
        ``python_version``."""
        return cls(flow=flow, run_id=run_id, step=step, task_id=task_id, attempt=attempt, status="failed",
                   started_at=started_at, finished_at=started_at, artifacts={}, retry_count=attempt, user=user,
                   hostname=socket.gethostname(), python_version=python_version, input_paths=list(input_paths),
                   foreach_stack=[{k: f.get(k) for k in FRAME_KEYS} for f in foreach], iteration=list(iteration),
                   parallel={"node_index": parallel["node_index"], "num_nodes": parallel["num_nodes"]}
                   if parallel else None,
                   logs={s: log_name(flow, run_id, step, task_id, attempt, s) for s in ("stdout", "stderr")})

    def finish(self, status: str, artifacts: dict[str, dict]) -> None:
        """The attempt ends now with ``status`` and ``artifacts``."""
        self.status, self.finished_at, self.artifacts = status, time.time(), artifacts

    def failed(self, type_: str, message: str, traceback: str = "", *, finished_at: float | None = None) -> Manifest:
        """A copy that failed with this exception, ended at ``finished_at`` if given (the scheduler's manifest of an
        attempt that could not be submitted, or died without writing one, or says ok though its process failed)."""
        return self._copy(status="failed", exception=exception_record(type_, message, traceback),
                          finished_at=self.finished_at if finished_at is None else finished_at)

    def with_reason(self, reason: str) -> Manifest:
        """A copy whose exception's message ends with ``(reason)``: what the engine knows of the failure."""
        exc = self.exception or {}
        return self._copy(exception=dict(exc, message=f"{exc.get('message', '')} ({reason})"))

    def with_cause(self, cause: str, evidence: str) -> Manifest:
        """A copy whose exception has the failure's ``cause`` and its ``evidence`` (stoker.runtime.driver.causes)."""
        return self._copy(exception=dict(self.exception or {}, cause=cause, evidence=evidence))

    def cloned(self, *, run_id: str, task_id: str | None = None, user: str | None = None,
               input_paths: list[str] | None = None) -> Manifest:
        """This task cloned into run ``run_id`` by ``resume``: the same artifacts (their blobs are shared, nothing is
        copied) and logs, attempt 0, ``origin_task`` the original task's pathspec (its own origin's, if a clone)."""
        origin = self.origin_task or pathspec(self.flow, self.run_id, self.step, self.task_id)
        return self._copy(run_id=run_id, task_id=task_id or self.task_id, attempt=0, retry_count=0,
                          origin_task=origin, user=user or self.user,
                          input_paths=self.input_paths if input_paths is None else list(input_paths))

    def _copy(self, **changes: Any) -> Manifest:
        return replace(self, extra=dict(self.extra), **changes)  # (its other values are shared, as {**m} shares them)

    # a hook's view (flow/decorators.py, TaskContext.manifest): the keys of to_dict() as a dict's
    def __getitem__(self, key: str) -> Any:
        if key not in _FIELDS:
            return self.extra[key]
        value = getattr(self, key)
        if value is None and key in _WHEN_SET:
            raise KeyError(key)
        return value

    def __setitem__(self, key: str, value: Any) -> None:
        if key in _FIELDS:
            setattr(self, key, value)
        else:
            self.extra[key] = value

    def __contains__(self, key: str) -> bool:
        return self.get(key, _ABSENT) is not _ABSENT

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default


_ABSENT = object()
_FIELDS = frozenset(f.name for f in fields(Manifest)) - {"extra"}
_ALWAYS = tuple(f.name for f in fields(Manifest) if f.name not in _WHEN_SET and f.name != "extra")


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


def clone_manifest(manifest: dict[str, Any], *, run_id: str, task_id: str | None = None, user: str | None = None,
                   input_paths: list[str] | None = None) -> dict[str, Any]:
    """:meth:`Manifest.cloned` of a manifest dict, as a dict: the task cloned into run ``run_id`` by ``resume``."""
    return Manifest.from_dict(manifest).cloned(run_id=run_id, task_id=task_id, user=user,
                                               input_paths=input_paths).to_dict()


def validate_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """Check a manifest's required fields and fill the optional ones; return a normalized copy (a dict:
    ``Manifest.from_dict(manifest).to_dict()``)."""
    return Manifest.from_dict(manifest).to_dict()


def write_manifest(store: BlobStore, manifest: Manifest | dict[str, Any]) -> str:
    """Validate, sign and atomically write an attempt's manifest; return its object name.

    ``manifest`` gets the signature (and its pickled artifacts their owner, see stoker.store.signing) as
    written, so indexing it gives the same rows as indexing the stored copy."""
    return store_manifest(store, manifest)[0]


def store_manifest(store: BlobStore, manifest: Manifest | dict[str, Any]) -> tuple[str, bytes]:
    """:func:`write_manifest`, also returning the bytes stored (a local member hands them to its scheduler)."""
    if isinstance(manifest, Manifest):
        manifest.validate()  # a hook may have changed it since it was built
        m = manifest
    else:
        m = Manifest.from_dict(manifest)
    name = manifest_name(m.flow, m.run_id, m.step, m.task_id, m.attempt)
    mark_owner(m.artifacts, m.user, pathspec(m.flow, m.run_id))
    doc = m.to_dict()
    try:
        json.dumps(doc, allow_nan=False)
        signed = sign(store.url, name, doc)
    except (TypeError, ValueError) as e:
        raise StoreError(f"manifest {name} is not JSON-serializable: {e}") from e
    data = json.dumps(signed, sort_keys=True).encode()
    store.write(name, data)
    manifest[SIGNATURE] = signed[SIGNATURE]
    return name, data


def keep_recorded_cause(store: BlobStore, manifest: Manifest) -> None:
    """Before a member stores its failed attempt's manifest, which never carries a cause: put in the cause and
    evidence the driver already recorded in the stored one (a gang node the driver stopped, then finished a few
    seconds later without waiting for it, writes after the driver; its write must not drop the cause). In place."""
    if manifest.status != "failed" or (manifest.exception or {}).get("cause"):
        return
    name = manifest_name(manifest.flow, manifest.run_id, manifest.step, manifest.task_id, manifest.attempt)
    try:
        if not store.exists(name):
            return
        stored = read_manifest_object(store, name)
    except Exception:  # noqa: BLE001 - none to keep (unreadable, not ours): the driver classifies this one
        return
    exc = stored.get("exception") or {}
    if exc.get("cause"):
        manifest.exception = dict(manifest.exception or {}, cause=exc["cause"], evidence=exc.get("evidence"))


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
