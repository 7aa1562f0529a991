"""Committed, sharded checkpoints with ``torch.distributed.checkpoint`` (DCP).

Layout of a checkpoint folder (a local path or an fsspec URL)::

    <dir>/step_00000200/   DCP shards (``__<rank>_0.distcp``), ``.metadata``, ``manifest.json``
    <dir>/latest           the name of the newest committed checkpoint

A checkpoint is written under ``.tmp-step_XXXXXXXX``, rank 0 then checksums every file into
``manifest.json`` (step, sha256 and size per file, the config fingerprint, the resolved config), renames
the folder and finally replaces ``latest`` atomically. A folder without a manifest, or whose files do
not match it, is never loaded. Only the last ``keep`` checkpoints stay.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import random
import re
import time
import uuid
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from stoker.errors import CheckpointError

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
LATEST = "latest"
PREFIX = "step_"


def parse_manifest(text: str, where: str) -> dict[str, Any]:
    """A checkpoint manifest, or CheckpointError naming it when it is truncated or not one (a reader then falls
    back to an earlier checkpoint or refuses with one line)."""
    try:
        manifest = json.loads(text)
    except ValueError as e:
        raise CheckpointError(f"{where} is not valid JSON ({e}): the checkpoint is damaged; use an earlier one") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(isinstance(m, dict) and "sha256" in m and "bytes" in m
                                              for m in files.values()):
        raise CheckpointError(f"{where} lists no files with checksums: the checkpoint is damaged; use an earlier one")
    return manifest


def step_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def rng_state() -> dict[str, Any]:
    """Every RNG a training step may touch (torch CPU/CUDA, numpy, python), as tensors and plain Python
    values only, so that it loads with ``torch.load(weights_only=True)`` (no pickled objects)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": {"version": int(version), "internal": torch.tensor(internal, dtype=torch.int64),
                   "gauss_next": None if gauss_next is None else float(gauss_next)},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()  # this rank's device only: a resume may see fewer GPUs
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(int(x) for x in p["internal"].tolist()), p["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def load_trainer_state(data: bytes | io.BytesIO, where: str) -> dict[str, Any]:
    """The trainer's own state (step, schedule, loader position, RNGs) from a checkpoint, read with
    ``torch.load(weights_only=True)``: tensors and plain values only, never code. Anyone who can write
    to a checkpoint folder could otherwise run code on every rank that resumes from it."""
    buf = data if isinstance(data, io.BytesIO) else io.BytesIO(data)
    buf.seek(0)
    try:
        state = torch.load(buf, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises UnpicklingError (or RuntimeError) for anything but plain data
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"checkpoint {where}: its trainer state is not plain tensors and values ({first[:200]}); it was "
            "written by an older stoker or tampered with, and is not unpickled. Resume from a checkpoint written "
            "by this version, or start fresh with checkpoint.resume='never' (--set checkpoint.resume=never)"
        ) from None
    if not isinstance(state, dict) or not {"step", "schedule", "loader", "rng"} <= state.keys():
        raise CheckpointError(f"checkpoint {where}: its trainer state lacks step/schedule/loader/rng; it is "
                              "damaged; resume from another checkpoint")
    return state


def _split(url: str) -> tuple[str, str]:
    """(checkpoint directory, checkpoint name) of a checkpoint URL."""
    url = url.rstrip("/")
    return tuple(url.rsplit("/", 1)) if "/" in url else (".", url)  # type: ignore[return-value]


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _broadcast(obj: Any) -> Any:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]
    return obj


class _Store:
    """The few file operations checkpoints need, on a local folder or an fsspec URL."""

    def __init__(self, root: str) -> None:
        import fsspec

        self.root = root.rstrip("/")
        self.fs, self.path = fsspec.core.url_to_fs(self.root)
        self.local = self.fs.protocol in ("file", "local") or "file" in (self.fs.protocol or ())

    def join(self, *parts: str) -> str:
        return "/".join([self.path, *parts])

    def url(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def exists(self, *parts: str) -> bool:
        return self.fs.exists(self.join(*parts))

    def read_text(self, *parts: str) -> str:
        with self.fs.open(self.join(*parts), "r") as f:
            return f.read()

    def write_atomic(self, text: str, *parts: str) -> None:
        target = self.join(*parts)
        if self.local:
            tmp = f"{target}.{uuid.uuid4().hex}.tmp"
            with open(tmp, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)  # atomic on POSIX
        else:
            self.fs.pipe(target, text.encode())  # a single PUT is atomic on object stores

    def files(self, name: str) -> dict[str, str]:
        """relative path -> absolute path of every file of checkpoint ``name``."""
        base = self.join(name)
        if not self.local:
            self.fs.invalidate_cache()  # other ranks and processes wrote here since this process last listed
        out = {}
        for full in self.fs.find(base):
            rel = full[len(base) :].lstrip("/")
            if rel != MANIFEST:
                out[rel] = full
        return out

    def sha256(self, full: str) -> tuple[str, int]:
        h, size = hashlib.sha256(), 0
        with self.fs.open(full, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
                size += len(chunk)
        return h.hexdigest(), size

    def remove(self, name: str) -> None:
        if self.fs.exists(self.join(name)):
            self.fs.rm(self.join(name), recursive=True)

    def list(self) -> list[str]:
        if not self.fs.exists(self.path):
            return []
        return sorted(os.path.basename(p.rstrip("/")) for p in self.fs.ls(self.path, detail=False))


class Checkpointer:
    """Saves and loads committed checkpoints under ``directory`` (every rank creates one)."""

    def __init__(self, directory: str, *, keep: int = 3, async_save: bool = False,
                 fingerprint: dict[str, Any] | None = None, config: dict[str, Any] | None = None,
                 layout: dict[str, Any] | None = None, hints: dict[str, str] | None = None) -> None:
        self.store = _Store(directory)
        self.directory = directory
        self.keep, self.async_save = keep, async_save
        self.fingerprint, self.config, self.layout = fingerprint or {}, config or {}, layout or {}
        self.hints = hints or {}  # fingerprint key -> what the user can do about a difference
        self._pending: tuple[Future, int, str] | None = None
        self._async_group: Any = None
        if _rank() == 0:
            self.store.fs.makedirs(self.store.path, exist_ok=True)
            for name in self.store.list():
                if name.startswith(".tmp-"):  # torn saves of an earlier attempt
                    self.store.remove(name)
        _barrier()

    # -- saving ---------------------------------------------------------------------------------
    def save(self, step: int, state: dict[str, Any]) -> str:
        """Write ``state`` (a DCP state dict) as checkpoint ``step``; returns its URL once committed
        (async: once staged; it is committed before the next save or at :meth:`finalize`)."""
        self.wait()
        name = step_name(step)
        # A folder is written aside and renamed into place; on an object store there is no rename (a copy of the
        # whole checkpoint is no commit): it is written in place, and its manifest, written last, commits it.
        tmp = f".tmp-{name}" if self.store.local else name
        if _rank() == 0:
            self.store.remove(tmp)
        _barrier()
        writer = self._writer(self.store.url(tmp))
        start = time.perf_counter()
        if self.async_save:
            if self._async_group is None and dist.is_initialized():
                self._async_group = dist.new_group(backend="gloo")  # keep checkpoint traffic off the training group
            future = dcp.async_save(state, storage_writer=writer, process_group=self._async_group)
            self._pending = (future, step, tmp)
            log.info("checkpoint %s staged in %.2fs (writing in the background)", name, time.perf_counter() - start)
            return self.store.url(name)
        dcp.save(state, storage_writer=writer)
        self._commit(step, tmp)
        log.info("checkpoint %s committed in %.2fs", name, time.perf_counter() - start)
        return self.store.url(name)

    def wait(self) -> None:
        """Finish and commit a pending async save."""
        if self._pending is None:
            return
        future, step, tmp = self._pending
        self._pending = None
        future.result()
        self._commit(step, tmp)

    def finalize(self) -> None:
        self.wait()

    def _writer(self, url: str) -> Any:
        if self.store.local:
            return dcp.FileSystemWriter(self.store.fs._strip_protocol(url))
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        return FsspecWriter(url)

    def _commit(self, step: int, tmp: str) -> None:
        _barrier()  # every rank's shards are on storage
        name = step_name(step)
        if _rank() == 0:
            files = {}
            for rel, full in sorted(self.store.files(tmp).items()):
                digest, size = self.store.sha256(full)
                files[rel] = {"sha256": digest, "bytes": size}
            manifest = {"step": step, "files": files, "fingerprint": self.fingerprint, "config": self.config,
                        "layout": self.layout, "created": time.time(), "torch": torch.__version__}
            self.store.write_atomic(json.dumps(manifest, indent=1, sort_keys=True), tmp, MANIFEST)
            if tmp != name:
                self.store.remove(name)  # a re-save of the same step (after a resume) replaces it
                self.store.fs.mv(self.store.join(tmp), self.store.join(name), recursive=True)
            self.store.write_atomic(name, LATEST)
            self._prune(keep_name=name)
        _barrier()

    def _prune(self, keep_name: str) -> None:
        committed = [n for n in self.store.list() if n.startswith(PREFIX) and self.store.exists(n, MANIFEST)]
        for name in committed[: max(0, len(committed) - self.keep)]:
            if name != keep_name:
                self.store.remove(name)

    # -- loading --------------------------------------------------------------------------------
    def verify(self, name: str) -> dict[str, Any]:
        """The manifest of checkpoint ``name`` after checking every file against it (CheckpointError if not)."""
        if not self.store.exists(name, MANIFEST):
            raise CheckpointError(f"{self.store.url(name)} has no {MANIFEST}: the checkpoint was never committed "
                                  "(torn write); resume from an earlier checkpoint")
        manifest = parse_manifest(self.store.read_text(name, MANIFEST), self.store.url(name, MANIFEST))
        present = self.store.files(name)
        for rel, meta in manifest["files"].items():
            if rel not in present:
                raise CheckpointError(f"{self.store.url(name, rel)} is missing: the checkpoint is incomplete")
            digest, size = self.store.sha256(present[rel])
            if digest != meta["sha256"] or size != meta["bytes"]:
                raise CheckpointError(f"{self.store.url(name, rel)} does not match its checksum in {MANIFEST}: "
                                      "the checkpoint is corrupted; resume from an earlier one")
        return manifest

    def latest(self) -> str | None:
        """Name of the newest loadable checkpoint here (``latest``, else the newest valid one), or None."""
        names = sorted((n for n in self.store.list() if n.startswith(PREFIX)), reverse=True)
        if self.store.exists(LATEST):
            pointed = self.store.read_text(LATEST).strip()
            if re.fullmatch(rf"{PREFIX}\d+", pointed):  # a pointer is a checkpoint's name, never a path
                names = [pointed] + [n for n in names if n != pointed]
            else:
                log.warning("ignoring %s: it holds %r, not a checkpoint name", self.store.url(LATEST), pointed[:80])
        for name in names:
            try:
                self.verify(name)
                return name
            except CheckpointError as e:
                log.warning("skipping checkpoint %s: %s", name, e)
        return None

    def check_fingerprint(self, manifest: dict[str, Any], where: str) -> None:
        theirs = manifest.get("fingerprint", {})
        missing = sorted(set(self.fingerprint) - set(theirs))
        if missing and theirs:
            raise CheckpointError(
                f"checkpoint {where} was written by an earlier stoker version (its manifest has no {missing}); "
                "resume it with that version, or start afresh: checkpoint.resume=\"never\" or a new checkpoint.dir")
        diff = sorted(k for k in set(theirs) | set(self.fingerprint) if theirs.get(k) != self.fingerprint.get(k))
        if diff:
            detail = "; ".join(f"{k}: checkpoint {theirs.get(k)!r} vs now {self.fingerprint.get(k)!r}"
                               + (f" ({self.hints[k]})" if k in self.hints else "") for k in diff)
            raise CheckpointError(
                f"checkpoint {where} was written by another configuration ({detail}); resume with the same model "
                "and parallel layout, or point checkpoint.dir at a new folder to start afresh"
            )

    def inspect(self, url: str) -> dict[str, Any]:
        """The manifest of checkpoint ``url`` once rank 0 verified every file and its fingerprint matches."""
        base, name = _split(url)
        result: Any = None
        if _rank() == 0:
            try:
                result = Checkpointer.verify(self._with_store(_Store(base)), name)
            except CheckpointError as e:
                result = e
            except Exception as e:  # unreadable manifest, storage errors
                result = CheckpointError(f"cannot read checkpoint {url}: {e}")
        result = _broadcast(result)
        if isinstance(result, Exception):
            raise result
        self.check_fingerprint(result, url)
        return result

    def load(self, url: str, state: dict[str, Any], manifest: dict[str, Any] | None = None) -> dict[str, Any]:
        """Load checkpoint ``url`` into ``state`` in place (verified by :meth:`inspect` unless its manifest
        is given); returns the manifest."""
        manifest = manifest if manifest is not None else self.inspect(url)
        base, name = _split(url)
        store = _Store(base)
        if store.local:
            reader: Any = dcp.FileSystemReader(store.fs._strip_protocol(store.url(name)))
        else:
            from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

            reader = FsspecReader(store.url(name))
        try:
            dcp.load(state, storage_reader=reader)
        except Exception as e:
            raise CheckpointError(f"cannot load checkpoint {url}: {e}") from e
        log.info("loaded checkpoint %s (step %d)", url, manifest["step"])
        return manifest

    def _with_store(self, store: _Store) -> Checkpointer:
        clone = object.__new__(Checkpointer)
        clone.__dict__.update(self.__dict__)
        clone.store = store
        return clone


def resolve_resume(checkpointer: Checkpointer, resume_from: str, resume: str) -> str | None:
    """URL of the checkpoint to resume from: ``resume_from`` (a checkpoint or a checkpoint folder with
    ``latest``), else with ``resume='auto'`` the newest valid checkpoint in the checkpointer's folder."""
    if resume_from:
        store = _Store(resume_from)
        if store.exists(MANIFEST) or store.exists(".metadata"):
            return resume_from.rstrip("/")
        if store.exists(LATEST) or any(n.startswith(PREFIX) for n in store.list()):
            name = _broadcast(Checkpointer._with_store(checkpointer, store).latest() if _rank() == 0 else None)
            if name is None:
                raise CheckpointError(f"checkpoint.resume_from={resume_from}: no valid checkpoint in it")
            return store.url(name)
        raise CheckpointError(f"checkpoint.resume_from={resume_from}: no checkpoint there (no {MANIFEST} or "
                              f"{LATEST}); give a step_XXXXXXXX folder or a checkpoint directory")
    if resume != "auto":
        return None
    name = _broadcast(checkpointer.latest() if _rank() == 0 else None)
    return None if name is None else checkpointer.store.url(name)
