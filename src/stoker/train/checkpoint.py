"""Committed, sharded checkpoints with ``torch.distributed.checkpoint`` (DCP).

Layout of a checkpoint folder (a local path or an object-store URL: ``s3://``, ``gs://`` ...)::

    <dir>/step_00000200/   DCP shards (``__<rank>_0.distcp``), ``.metadata``, ``manifest.json``
    <dir>/latest           the name of the newest committed checkpoint

On a local disk a checkpoint is written under ``.tmp-step_XXXXXXXX-<attempt>`` (a name no other attempt
uses). Every rank then checksums the files it wrote, and rank 0 writes them into ``manifest.json`` (step,
sha256 and size per file, the config fingerprint, the resolved config), signs it with the store's key (see
:mod:`stoker.train.checkpoint_signing`) and commits: an older ``step_XXXXXXXX`` of the same step is renamed aside
(``.old-step_XXXXXXXX-<attempt>``), the new folder renamed into place, ``latest`` replaced atomically, and
only then the aside folder deleted. A crash at any point leaves a loadable checkpoint: readers fall back to
the newest valid one when ``latest`` names a missing or damaged one. On an object store there is no rename
(a copy is no commit): the checkpoint is written in place and its manifest, written last, commits it.
Temporary folders of other attempts are deleted only once stale (``STOKER_CKPT_TMP_MAX_AGE`` seconds,
6 h by default), never while another attempt may still be writing them. Only the last ``keep`` stay.

Rank 0's I/O (cleanup, commit, listing) reports its failure to every rank before anyone waits, so a full
disk is one CheckpointError on every rank at once, not a hang until the collective timeout.

An async save blocks training only while the state is copied into host buffers reused from save to save
(:mod:`stoker.train.checkpoint_stage`); the write, the checksums and the commit of that copy run in one
background thread over a gloo group of their own, and ``wait()`` only joins them.
"""

from __future__ import annotations

import io
import json
import logging
import os
import random
import shutil
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from stoker.errors import CheckpointError
from stoker.train.checkpoint_files import (  # noqa: F401  (re-exported: hf.py, tests)
    ERRORS,
    LATEST,
    MANIFEST,
    PREFIX,
    Store,
    describe_failure,
    find,
    group,
    hash_written,
    is_checkpoint,
    is_step_name,
    newest_valid,
    on_rank0,
    parse_manifest,
    split,
    step_name,
    verify,
)
from stoker.train.checkpoint_objects import ObjectReader, ObjectWriter
from stoker.train.checkpoint_signing import KEY_HINT, sign_manifest
from stoker.train.checkpoint_stage import HostStager

log = logging.getLogger(__name__)

TMP_MAX_AGE_S = 6 * 3600.0  # a temporary checkpoint folder untouched this long belongs to a dead attempt
_Store, _split = Store, split  # earlier names


def _rank() -> int:
    return group()[0]


def _barrier(pg: Any = None) -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier(group=pg)


def _tmp_max_age() -> float:
    raw = os.environ.get("STOKER_CKPT_TMP_MAX_AGE", "")
    try:
        return float(raw) if raw else TMP_MAX_AGE_S
    except ValueError:
        log.warning("ignoring STOKER_CKPT_TMP_MAX_AGE=%r: not a number of seconds", raw)
        return TMP_MAX_AGE_S


def _age(path: str) -> float:
    """Seconds since anything in folder ``path`` (or the folder itself) last changed."""
    newest = os.stat(path).st_mtime
    for entry in os.scandir(path):
        try:
            newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
        except FileNotFoundError:
            continue
    return time.time() - newest


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


class Checkpointer:
    """Saves and loads committed checkpoints under ``directory`` (every rank creates one)."""

    def __init__(self, directory: str, *, keep: int = 3, async_save: bool = False,
                 fingerprint: dict[str, Any] | None = None, config: dict[str, Any] | None = None,
                 layout: dict[str, Any] | None = None, hints: dict[str, str] | None = None) -> None:
        self.store = Store(directory)
        self.directory = directory
        self.keep, self.async_save = keep, async_save
        self.fingerprint, self.config, self.layout = fingerprint or {}, config or {}, layout or {}
        self.hints = hints or {}  # fingerprint key -> what the user can do about a difference
        self._pending: tuple[Future, int, str] | None = None
        self._async_group: Any = None
        self._executor: ThreadPoolExecutor | None = None  # one thread: async writes and commits, in order
        self._stager = HostStager()  # host buffers reused by every async save
        self._verified: dict[str, dict[str, Any]] = {}  # url -> manifest verified by latest(), for inspect()
        # one token per attempt, the same on every rank: its temporary folders are its own
        self.token: str = on_rank0(self._set_up, self.store.url())

    def _set_up(self) -> str:
        self.store.makedirs()
        if self.store.local:
            max_age = _tmp_max_age()
            for name in self.store.list():
                path = self.store.join(name)
                if name.startswith(".old-"):  # a commit interrupted between its two renames: put it back
                    target = name[len(".old-"):].rsplit("-", 1)[0]
                    if not os.path.exists(self.store.join(target)):
                        os.rename(path, self.store.join(target))
                        log.warning("restored checkpoint %s from an interrupted commit", self.store.url(target))
                        continue
                if name.startswith((".tmp-", ".old-")) and _age(path) > max_age:
                    log.info("deleting %s: a temporary checkpoint folder of an attempt that ended",
                             self.store.url(name))
                    shutil.rmtree(path, ignore_errors=True)
        return uuid.uuid4().hex[:12]

    # -- saving ---------------------------------------------------------------------------------
    def save(self, step: int, state: dict[str, Any]) -> str:
        """Write ``state`` (a DCP state dict) as checkpoint ``step``; returns its URL once committed.
        Async: returns once the state is copied into host memory (training may change it then); the write and
        the commit run in a background thread, and :meth:`wait` (the next save, :meth:`finalize`) joins them."""
        self.wait()
        name = step_name(step)
        # A folder is written aside and renamed into place; on an object store there is no rename (a copy of the
        # whole checkpoint is no commit): it is written in place, and its manifest, written last, commits it.
        tmp = f".tmp-{name}-{self.token}" if self.store.local else name
        if not self.store.local:
            on_rank0(lambda: self.store.remove(name), self.store.url(name))  # uncommit a re-saved step first
        start = time.perf_counter()
        if self.async_save:
            try:
                staged = self._stager.stage(state)
            except ERRORS as e:
                raise self._failed(e, name, tmp) from e
            if self._async_group is None and dist.is_initialized():
                self._async_group = dist.new_group(backend="gloo")  # keep checkpoint traffic off training
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stoker-checkpoint")
            future = self._executor.submit(self._write_and_commit, step, tmp, staged, self._async_group)
            self._pending = (future, step, tmp)
            log.info("checkpoint %s staged in %.2fs (written and committed in the background)", name,
                     time.perf_counter() - start)
            return self.store.url(name)
        writer = self._writer(tmp)
        try:
            dcp.save(state, storage_writer=writer)  # the same error on every rank
        except ERRORS as e:
            raise self._failed(e, name, tmp) from e
        self._commit(step, tmp, known=getattr(writer, "digests", None))
        log.info("checkpoint %s committed in %.2fs", name, time.perf_counter() - start)
        return self.store.url(name)

    def _write_and_commit(self, step: int, tmp: str, staged: dict[str, Any], pg: Any) -> None:
        """The background half of an async save: the staged copy written, then committed, over ``pg`` (the
        checkpoint's own gloo group: the training thread keeps the default group to itself)."""
        start = time.perf_counter()
        writer = self._writer(tmp)
        dcp.save(staged, storage_writer=writer, process_group=pg)
        self._commit(step, tmp, pg, known=getattr(writer, "digests", None))
        log.info("checkpoint %s committed in the background in %.2fs", step_name(step), time.perf_counter() - start)

    def wait(self) -> None:
        """Wait for a pending async save to be committed; CheckpointError (on every rank) if it failed."""
        if self._pending is None:
            return
        future, step, tmp = self._pending
        self._pending = None
        try:
            future.result()
        except ERRORS as e:
            raise self._failed(e, step_name(step), tmp) from e

    def _failed(self, exc: BaseException, name: str, tmp: str) -> CheckpointError:
        """The error of a failed write; this attempt's partial folder is deleted (it frees a full disk)."""
        error = CheckpointError(describe_failure(exc, self.store.url(name),
                                                 self.store.path if self.store.local else None))
        if self.store.local and _rank() == 0:
            shutil.rmtree(self.store.join(tmp), ignore_errors=True)
        return error

    def finalize(self) -> None:
        self.wait()

    def close(self) -> None:
        """Teardown on every rank: a pending async save is waited for (its error only logged: on a clean end
        :meth:`finalize` has waited already) and the background thread joined; the checkpoint's own gloo group is
        let go here and destroyed with the others by ``destroy_process_group()`` (after the ranks' last barrier),
        so that nothing keeps it, and its gloo worker threads, alive to the interpreter's exit."""
        try:
            self.wait()
        except CheckpointError as e:
            log.warning("a pending async checkpoint failed at shutdown: %s", e)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self._async_group = None

    def _writer(self, tmp: str) -> Any:
        """DCP's writer into folder ``tmp``; on an object store every rank streams its shards there as parallel
        multipart uploads, hashing them on the way (:mod:`stoker.train.checkpoint_objects`)."""
        if self.store.local:
            return dcp.FileSystemWriter(self.store.join(tmp))
        return ObjectWriter(self.store.objects, tmp)

    def _commit(self, step: int, tmp: str, pg: Any = None, known: dict[str, Any] | None = None) -> None:
        """Every rank checksums the files it wrote (in parallel; ``known``: hashed while written), then rank 0
        commits (collective over ``pg``)."""
        _barrier(pg)  # every rank's shards are on storage
        files = hash_written(self.store, tmp, pg, known)
        on_rank0(lambda: self._commit_files(step, tmp, files), self.store.url(step_name(step)), pg)

    def _commit_files(self, step: int, tmp: str, files: dict[str, dict[str, Any]] | None = None) -> None:
        """Rank 0: manifest, then (local) rename aside / rename into place / ``latest`` / delete aside."""
        name = step_name(step)
        files = dict(files or {})
        on_disk = self.store.files(tmp)
        files.update(self.store.hash_files({rel: on_disk[rel] for rel in set(on_disk) - set(files)}))
        manifest = {"step": step, "name": name, "directory": self.store.url(), "files": files,
                    "fingerprint": self.fingerprint, "config": self.config, "layout": self.layout,
                    "created": time.time(), "torch": torch.__version__}  # signed: where it belongs (check_place)
        manifest = sign_manifest(manifest)  # readers check it before trusting a checksum (or unpickling anything)
        self.store.write_atomic(json.dumps(manifest, indent=1, sort_keys=True), tmp, MANIFEST)
        aside = None
        if tmp != name:
            target = self.store.join(name)
            if os.path.exists(target):  # a re-save of the same step (after a resume) replaces it
                aside = self.store.join(f".old-{name}-{self.token}")
                os.rename(target, aside)
            try:
                os.rename(self.store.join(tmp), target)
            except OSError:
                if aside is not None:
                    os.rename(aside, target)
                raise
        self.store.write_atomic(name, LATEST)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
        self._prune(keep_name=name)

    def _prune(self, keep_name: str) -> None:
        committed = [n for n in self.store.list() if n.startswith(PREFIX) and self.store.exists(n, MANIFEST)]
        for name in committed[: max(0, len(committed) - self.keep)]:
            if name != keep_name:
                self.store.remove(name)

    # -- loading --------------------------------------------------------------------------------
    def verify(self, name: str) -> dict[str, Any]:
        """The manifest of checkpoint ``name`` after checking every file against it (CheckpointError if not);
        under a process group every rank checks its share of the files (collective)."""
        return verify(self.store, name)

    def latest(self) -> str | None:
        """Name of the newest loadable checkpoint here (``latest``, else the newest valid one), or None.
        Collective under a process group (the ranks share the verification)."""
        skipped: list[str] = []
        found = newest_valid(self.store, skipped)
        if found is None:
            if skipped and all(KEY_HINT in e for e in skipped):  # starting afresh would prune them: refuse
                raise CheckpointError(f"checkpoint.resume=auto: no checkpoint in {self.store.url()} verifies with "
                                      f"{KEY_HINT} (the cause is the key, not damage): {skipped[0]}")
            return None
        self._verified[self.store.url(found[0])] = found[1]
        return found[0]

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
        """The manifest of checkpoint ``url`` once every file is verified (each rank its share, in parallel;
        not again when :meth:`latest` just did) and its fingerprint matches. Collective under a group."""
        url = url.rstrip("/")
        manifest = self._verified.pop(url, None)
        if manifest is None:
            base, name = split(url)
            manifest = verify(Store(base), name)
        self.check_fingerprint(manifest, url)
        return manifest

    def load(self, url: str, state: dict[str, Any], manifest: dict[str, Any] | None = None) -> dict[str, Any]:
        """Load checkpoint ``url`` into ``state`` in place (verified by :meth:`inspect` unless its manifest
        is given); returns the manifest."""
        manifest = manifest if manifest is not None else self.inspect(url)
        base, name = split(url)
        store = Store(base)
        if store.local:
            reader: Any = dcp.FileSystemReader(store.join(name))
        else:  # shards come down in parallel, each checked against the manifest before DCP reads it
            reader = ObjectReader(store.objects, name, manifest["files"])
        try:
            dcp.load(state, storage_reader=reader)
        except ERRORS as e:
            raise CheckpointError(f"cannot load checkpoint {url}: {describe_failure(e, url)}") from e
        log.info("loaded checkpoint %s (step %d)", url, manifest["step"])
        return manifest

    def _with_store(self, store: Store) -> Checkpointer:
        clone = object.__new__(Checkpointer)
        clone.__dict__.update(self.__dict__)
        clone.store = store
        return clone


def resolve_resume(checkpointer: Checkpointer, resume_from: str, resume: str) -> str | None:
    """URL of the checkpoint to resume from: ``resume_from`` (a checkpoint, or a checkpoint folder: its newest
    valid one), else with ``resume='auto'`` the newest valid checkpoint in the checkpointer's folder.
    Collective under a process group (every rank calls it)."""
    if resume_from:
        resume_from = resume_from.rstrip("/")
        if is_checkpoint(resume_from):
            return resume_from  # verified when loaded: a damaged one is refused, never swapped for another
        store = Store(resume_from)
        if store.exists(LATEST) or any(is_step_name(n) for n in store.list()):
            url, manifest = find(resume_from, "checkpoint.resume_from")
            checkpointer._verified[url] = manifest
            return url
        raise CheckpointError(f"checkpoint.resume_from={resume_from}: no checkpoint there (no {MANIFEST} or "
                              f"{LATEST}); give a step_XXXXXXXX folder or a checkpoint directory")
    if resume != "auto":
        return None
    name = checkpointer.latest()
    return None if name is None else checkpointer.store.url(name)
