"""The contents the run page shows: logs, metric and monitor series, artifacts, cards and the pretraining
pipeline's results. Object names are built from components checked by :mod:`stoker.ui.safe` only."""

from __future__ import annotations

import json
import pprint
import threading
from pathlib import Path
from typing import Any

from stoker.store.artifacts import load_artifact
from stoker.store.blobs import BlobStore, check_name
from stoker.store.manifest import artifact_descriptor, log_name, read_manifest, run_prefix
from stoker.store.metadata import MetadataDB
from stoker.store.series import chunk_seq, decode_chunk

PREVIEW_MAX = 4096  # artifacts up to this size are loaded for a preview
MAX_POINTS = 5000  # per series sent to the browser (a longer series is thinned evenly, its last point kept)


def read_log(db: MetadataDB, store: BlobStore, home: Path, flow: str, run_id: str, step: str, task_id: str,
             attempt: int, stream: str, live: bool = False) -> tuple[bytes, bool] | None:
    """An attempt's log and whether it is final. While a task runs its log is what has landed so far: the
    chunks a remote task uploads (``<log>.parts/NNNNNN``, as ``Task.stdout`` reads them), or for a local task
    the file the scheduler appends to under ``$STOKER_HOME/logs``. None if the attempt does not exist.
    ``live``: the attempt runs, not indexed yet (the scheduler indexes attempts as they end)."""
    a = db.get_attempt(flow, run_id, step, task_id, attempt)
    if a is None and not live:
        return None
    running = a is None or a.status == "running"
    logs = ((a.manifest if a else None) or {}).get("logs") or {}
    name = logs.get(stream) or log_name(flow, run_id, step, task_id, attempt, stream)
    check_name(name)
    if store.exists(name):
        return store.read(name), not running
    parts = sorted(store.list(name + ".parts/"))
    if parts:
        return b"".join(store.read(p) for p in parts), False
    local = home / "logs" / flow / run_id / step / f"{task_id}.{attempt}" / f"{stream}.log"
    try:
        return local.read_bytes(), False
    except OSError:
        return b"", not running


class SeriesReader:
    """Reads the series of a run, caching chunks (written once, never changed) so that polling is cheap."""

    def __init__(self, store: BlobStore) -> None:
        self.store = store
        self._chunks: dict[str, list[dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def _chunk(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            if name in self._chunks:
                return self._chunks[name]
        out = decode_chunk(name, self.store.read(name))
        with self._lock:
            self._chunks[name] = out
        return out

    def series(self, flow: str, run_id: str, kind: str) -> list[dict[str, Any]]:
        """Every series of ``kind`` in the run: ``{step, task_id, attempt, node, records}``, in name order."""
        base = f"{run_prefix(flow, run_id)}{kind}/"
        groups: dict[str, list[str]] = {}
        for name in self.store.list(base):
            folder = name.rsplit("/", 1)[0] + "/"
            if chunk_seq(name, folder) is not None:
                groups.setdefault(folder[:-1], []).append(name)
        out = []
        for folder, names in sorted(groups.items()):
            parts = folder[len(base):].split("/")
            if len(parts) not in (3, 4) or not parts[2].isdigit():
                continue
            records = [r for n in sorted(names, key=lambda n: chunk_seq(n, folder + "/") or 0) for r in self._chunk(n)]
            if len(records) > MAX_POINTS:
                every = -(-len(records) // MAX_POINTS)
                records = records[::every] + ([records[-1]] if (len(records) - 1) % every else [])
            out.append({"step": parts[0], "task_id": parts[1], "attempt": int(parts[2]),
                        "node": int(parts[3]) if len(parts) == 4 and parts[3].isdigit() else None,
                        "records": records})
        return out


def _loads_preview(desc: dict[str, Any]) -> bool:
    return desc.get("kind") == "pickle" and (desc.get("size") or 0) <= PREVIEW_MAX


def _preview(store: BlobStore, desc: dict[str, Any], signed: dict[str, Any] | None) -> str:
    """A small pickle's value, unpickled only from the attempt's verified manifest (``signed``: its artifacts;
    the index is not signed), else the stored repr."""
    trusted = (signed or {}).get(desc.get("name", ""))
    if isinstance(trusted, dict) and _loads_preview(trusted):
        try:
            return pprint.pformat(load_artifact(store, trusted), width=100, compact=True)[:PREVIEW_MAX]
        except Exception:  # noqa: BLE001 - a class not importable here, an untrusted writer: the stored repr
            pass
    return str(desc.get("repr", ""))


def artifacts(db: MetadataDB, store: BlobStore, flow: str, run_id: str, step: str, task_id: str,
              attempt: int | None = None) -> list[dict[str, Any]]:
    rows = [a for a in db.list_artifacts(flow, run_id, step, task_id, attempt) if not a.name.startswith("_")]
    signed = None
    if any(_loads_preview(a.descriptor) for a in rows):
        task = db.get_task(flow, run_id, step, task_id) if attempt is None else None
        try:
            signed = read_manifest(store, flow, run_id, step, task_id,
                                   attempt if attempt is not None else task.attempt if task else 0)["artifacts"]
        except Exception:  # noqa: BLE001 - unsigned, forged, or gone: show the stored reprs only
            signed = None
    return [{"name": a.name, "type": a.type, "kind": a.kind, "size": a.size, "sha": a.sha,
             "preview": _preview(store, {**a.descriptor, "name": a.name}, signed)} for a in rows]


def cards(store: BlobStore, flow: str, run_id: str) -> list[dict[str, Any]]:
    """Every card of the run (``runs/<flow>/<run>/cards/<step>/<task>/<attempt>/<id>.html``) with its title."""
    base = f"{run_prefix(flow, run_id)}cards/"
    out = []
    for name in store.list(base):
        parts = name[len(base):].split("/")
        if len(parts) != 4 or not name.endswith(".html") or not parts[2].isdigit():
            continue
        card_id = parts[3][:-5]
        meta: dict[str, Any] = {}
        try:
            if store.exists(name[:-5] + ".json"):
                meta = json.loads(store.read(name[:-5] + ".json"))
        except (ValueError, OSError):
            meta = {}
        out.append({"step": parts[0], "task_id": parts[1], "attempt": int(parts[2]), "id": card_id,
                    "title": meta.get("title") or card_id, "type": meta.get("type"), "updated": meta.get("updated"),
                    "url": f"/api/runs/{flow}/{run_id}/cards/{parts[0]}/{parts[1]}/{parts[2]}/{card_id}"})
    return out


def card_html(store: BlobStore, flow: str, run_id: str, step: str, task_id: str, attempt: int,
              card_id: str) -> bytes | None:
    name = f"{run_prefix(flow, run_id)}cards/{step}/{task_id}/{attempt}/{card_id}.html"
    return store.read(name) if store.exists(name) else None


def _value(db: MetadataDB, store: BlobStore, flow: str, run_id: str, name: str) -> tuple[Any, bool]:
    """The newest value of artifact ``name`` in the run (any step), loaded if small enough."""
    for t in reversed(db.list_tasks(flow, run_id)):
        a = db.get_artifact(flow, run_id, t.step, t.task_id, name)
        if a is not None:
            try:  # from the verified manifest: the index is not signed
                return load_artifact(store, artifact_descriptor(store, flow, run_id, t.step, t.task_id, t.attempt,
                                                                name)), True
            except Exception:  # noqa: BLE001 - shown as missing rather than failing the page
                return None, False
    return None, False


def checkpoints(store: BlobStore, flow: str, run_id: str) -> dict[str, Any]:
    """The committed checkpoints the trainer wrote next to the run (``checkpoints/<flow>/<run>/step_*``)."""
    base = f"checkpoints/{flow}/{run_id}/"
    names = store.list(base)
    steps = sorted({n[len(base):].split("/")[0] for n in names if n[len(base):].startswith("step_")})
    committed = [s for s in steps if f"{base}{s}/manifest.json" in names]
    latest = store.read(base + "latest").decode().strip() if base + "latest" in names else None
    return {"folder": base, "steps": committed, "latest": latest}


def pipeline(db: MetadataDB, store: BlobStore, flow: str, run_id: str) -> dict[str, Any] | None:
    """The pretraining pipeline's results (LlamaPretrain: ``eval``, ``export_dir``, ``checkpoint``, ``metrics``),
    or None for a run that has none of them."""
    ev, has_eval = _value(db, store, flow, run_id, "eval")
    export, has_export = _value(db, store, flow, run_id, "export_dir")
    ckpt, has_ckpt = _value(db, store, flow, run_id, "checkpoint")
    metrics, _ = _value(db, store, flow, run_id, "metrics")
    listed = checkpoints(store, flow, run_id)
    if not (has_eval or has_export or has_ckpt or listed["steps"]):
        return None
    ev = ev if isinstance(ev, dict) else {}
    summary = {k: v for k, v in ev.items() if k != "samples" and isinstance(v, (int, float, str, type(None)))}
    return {"eval": summary, "samples": list(ev.get("samples") or []), "export_dir": export,
            "checkpoint": ckpt, "checkpoints": listed,
            "train": metrics if isinstance(metrics, dict) else None}
