"""Checkpoint files on storage: the store, verification against the manifest, picking the newest valid
checkpoint, and rank-0 I/O whose failure every rank sees at once.

Verification is shared among the ranks of a process group: file ``i`` of the manifest is checked by rank
``i % world`` (its size first, then its sha256, streamed, a few files at a time in threads), and the ranks
exchange their findings, so every rank raises the same error or none does. A single process checks all.
An extra file in a committed checkpoint folder (one its manifest does not list) is never read (DCP reads
only what ``.metadata`` names, and ``.metadata`` is checksummed): it is ignored with a warning.

The manifest is signed (HMAC-SHA256, :mod:`stoker.store.signing`) with the key of the store the run uses
(:mod:`stoker.train.checkpoint_signing`), and its signature is checked before its checksums are trusted:
loading a checkpoint
unpickles its ``.metadata``, so whoever could rewrite a manifest could otherwise run code on every reader.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from stoker.errors import CheckpointError
from stoker.store.objects import open_objects
from stoker.train.checkpoint_signing import KEY_HINT, check_signature

log = logging.getLogger("stoker.train.checkpoint")

# DCP's own error derives from BaseException, not Exception: catch it by name with the ordinary errors
ERRORS: tuple[type[BaseException], ...] = (Exception, CheckpointException)

MANIFEST = "manifest.json"
LATEST = "latest"
PREFIX = "step_"
METADATA = ".metadata"
_HASH_THREADS = 4


def is_step_name(name: str) -> bool:
    return re.fullmatch(rf"{PREFIX}\d+", name) is not None


def step_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def check_place(manifest: dict[str, Any], store: Store, name: str) -> None:
    """Refuse, like a damaged one, a checkpoint that is not the step its folder names: a ``step_N`` folder holding
    another step's files (one copied or renamed over it) would resume "from step N" while continuing from the
    other step, and export and evaluate the other step's weights as step N's. The signed manifest names its step,
    and since issue 27 the folder it was committed as (``name``) and in (``directory``); an older manifest, without
    them, is accepted when its step is the folder's. A folder that names no step (renamed by hand) claims none."""
    if not is_step_name(name):
        return
    step, folder_step = manifest.get("step"), int(name[len(PREFIX):])
    if isinstance(step, int) and not isinstance(step, bool) and step == folder_step:
        return
    was = manifest.get("name") or (step_name(step) if isinstance(step, int) else "no step")
    where = f" in {manifest['directory']}" if isinstance(manifest.get("directory"), str) else ""
    raise CheckpointError(
        f"{store.url(name)} holds the checkpoint of step {step}, not of step {folder_step}: its signed {MANIFEST} "
        f"says it was committed as {was}{where}, so it was copied or renamed over this folder and would continue "
        f"from step {step} as if it were step {folder_step}; use {was} itself, or delete {name} (the newest valid "
        "checkpoint before it is then used)")


def one_line(text: str, limit: int = 300) -> str:
    """The first line of an error's text, for messages that must stay one line."""
    first = next((line.strip() for line in str(text).splitlines() if line.strip()), "")
    return first[:limit]


def _disk_full(local_dir: str | None) -> bool:
    """Whether the local file system of ``local_dir`` is (nearly) full: torch's writer can report ENOSPC as
    a RuntimeError of its zip container."""
    if not local_dir:
        return False
    try:
        st = os.statvfs(local_dir)
    except OSError:
        return False
    free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    return free < min(1 << 20, total // 100 + 1) or free < total // 1000


def describe_failure(exc: BaseException, what: str, local_dir: str | None = None) -> str:
    """One line naming ``what`` failed and the fix: disk full, no permission, or the storage's own error."""
    if isinstance(exc, CheckpointError):
        return one_line(str(exc), 1000)
    err: BaseException | None = exc
    while err is not None and not isinstance(err, OSError):  # DCP wraps each rank's error
        if isinstance(err, CheckpointError):  # ours, raised inside DCP (a shard that fails its checksum)
            return one_line(str(err), 1000)
        inner = getattr(err, "failures", None)
        if isinstance(inner, dict) and inner:
            failure = next(iter(inner.values()))
            found = getattr(failure, "exc", failure)
            if isinstance(found, tuple):  # DCP's (exception, traceback) pair
                found = next((x for x in found if isinstance(x, BaseException)), None)
            err = found if isinstance(found, BaseException) and found is not err else None
            continue
        err = err.__cause__ or err.__context__
    cause = err if isinstance(err, BaseException) else exc
    text = f"{type(cause).__name__}: {cause}"
    if (isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT) or "No space left" in text
            or _disk_full(local_dir)):
        return (f"no space left on the device writing checkpoint {what}: free space, lower checkpoint.keep, or "
                "point checkpoint.dir elsewhere")
    if isinstance(err, OSError) and err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"cannot write checkpoint {what} ({err.strerror}): make checkpoint.dir writable or point it elsewhere"
    return f"checkpoint {what} failed: {one_line(text)}; check the storage of checkpoint.dir and retry"


def parse_manifest(text: str, where: str) -> dict[str, Any]:
    """A checkpoint manifest, or CheckpointError naming it when it is truncated or not one (a reader then falls
    back to an earlier checkpoint or refuses with one line)."""
    try:
        manifest = json.loads(text)
    except ValueError as e:
        raise CheckpointError(f"{where} is not valid JSON ({e}): the checkpoint is damaged; "
                              "use an earlier one") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(isinstance(m, dict) and "sha256" in m and "bytes" in m
                                              for m in files.values()):
        raise CheckpointError(f"{where} lists no files with checksums: the checkpoint is damaged; use an earlier one")
    for rel in files:
        parts = rel.split("/")
        if rel.startswith("/") or ".." in parts or "\\" in rel:
            raise CheckpointError(f"{where} names {rel!r}, a path outside the checkpoint: it was tampered with; "
                                  "use another checkpoint")
    return manifest


# -- distributed ------------------------------------------------------------------------------------------
def group() -> tuple[int, int]:
    """(rank, world size) of the default process group, (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def on_rank0(fn: Callable[[], Any], what: str, pg: Any = None) -> Any:
    """``fn()`` run on rank 0 alone, its result given to every rank. A failure on rank 0 (disk full, a storage
    error) is broadcast first, so every rank raises the same CheckpointError at once instead of waiting in a
    collective until it times out (30 min on NCCL). ``pg``: a process group of every rank (default: the default
    group), e.g. the checkpoint's own gloo group in a background thread."""
    rank, world = group()
    result, error = None, None
    if rank == 0:
        try:
            result = fn()
        except ERRORS as e:  # every failure, so the other ranks never wait for a result that never comes
            error = describe_failure(e, what)
    if world > 1:
        box = [(result, error)]
        dist.broadcast_object_list(box, src=0, group=pg)
        result, error = box[0]
    if error is not None:
        raise CheckpointError(error)
    return result


def agree(error: str | None, pg: Any = None) -> None:
    """Every rank raises the first rank's error (by rank order), or none does."""
    _, world = group()
    if world > 1:
        errors: list[Any] = [None] * world
        dist.all_gather_object(errors, error, group=pg)
        error = next((e for e in errors if e), None)
    if error:
        raise CheckpointError(error)


# -- storage ----------------------------------------------------------------------------------------------
class Store:
    """The few file operations checkpoints need, on a local folder or an object store (``s3://`` through boto3,
    honouring ``$STOKER_S3_ENDPOINT_URL``; ``gs://``, ``az://`` ... through fsspec), via
    :mod:`stoker.store.objects`. A file's ``full`` name is its local path, or its key in the object store."""

    def __init__(self, root: str) -> None:
        self.root = str(root).rstrip("/") or "/"
        self.objects = open_objects(self.root, error=CheckpointError)
        local = self.objects.local_root
        self.local = local is not None
        self.path = str(local) if local is not None else ""

    def join(self, *parts: str) -> str:
        return os.path.join(self.path, *parts) if self.local else "/".join(parts)

    def url(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def exists(self, *parts: str) -> bool:
        return os.path.exists(self.join(*parts)) if self.local else self.objects.exists("/".join(parts))

    def read_text(self, *parts: str) -> str:
        if self.local:
            with open(self.join(*parts), "rb") as f:
                data = f.read()
        else:
            data = self.objects.get_bytes("/".join(parts))
        return data.decode("utf-8", errors="replace")  # a flipped bit is a damaged file, not a crash

    def write_atomic(self, text: str, *parts: str) -> None:
        if not self.local:
            self.objects.put_bytes("/".join(parts), text.encode())  # a single PUT is atomic on object stores
            return
        target = self.join(*parts)
        tmp = f"{target}.{uuid.uuid4().hex}.tmp"
        try:
            with open(tmp, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)  # atomic on POSIX
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def makedirs(self) -> None:
        if self.local:
            os.makedirs(self.path, exist_ok=True)

    def files(self, name: str) -> dict[str, str]:
        """relative path -> full name of every file of checkpoint ``name`` but its manifest."""
        out = {}
        if self.local:
            base = self.join(name)
            for dirpath, _, filenames in os.walk(base):
                for f in filenames:
                    full = os.path.join(dirpath, f)
                    out[os.path.relpath(full, base).replace(os.sep, "/")] = full
        else:
            for o in self.objects.list(f"{name}/"):
                out[o.key[len(name) + 1:]] = o.key
        out.pop(MANIFEST, None)
        return out

    def sizes(self, name: str) -> dict[str, int]:
        """relative path -> size of every file of ``name`` (one listing on an object store)."""
        if self.local:
            return {rel: os.stat(full).st_size for rel, full in self.files(name).items()}
        return {o.key[len(name) + 1:]: o.size for o in self.objects.list(f"{name}/")}

    def sha256(self, full: str) -> tuple[str, int]:
        h, size = hashlib.sha256(), 0
        if not self.local:
            data = self.objects.get_bytes(full)  # parallel ranged GETs
            h.update(data)
            return h.hexdigest(), len(data)
        with open(full, "rb") as f:
            while chunk := f.read(1 << 22):  # streamed: memory stays flat whatever the file size
                h.update(chunk)  # hashlib releases the GIL: threads hash files in parallel
                size += len(chunk)
        return h.hexdigest(), size

    def size(self, full: str) -> int | None:
        if not self.local:
            return self.objects.size(full)
        try:
            return os.stat(full).st_size
        except FileNotFoundError:
            return None

    def remove(self, name: str) -> None:
        if self.local:
            if os.path.isdir(self.join(name)):
                shutil.rmtree(self.join(name))
            elif os.path.exists(self.join(name)):
                os.unlink(self.join(name))
            return
        self.objects.delete_many([o.key for o in self.objects.list(f"{name}/")] + [name])

    def list(self) -> list[str]:
        """Names directly under the root (checkpoint folders, ``latest``)."""
        if self.local:
            return sorted(os.listdir(self.path)) if os.path.isdir(self.path) else []
        return sorted({o.key.split("/", 1)[0] for o in self.objects.list()})

    def hash_all(self, name: str) -> dict[str, dict[str, Any]]:
        """{relative path: {sha256, bytes}} of every file of ``name`` (a few files at a time)."""
        return self.hash_files(self.files(name))

    def hash_files(self, files: dict[str, str]) -> dict[str, dict[str, Any]]:
        """{relative path: {sha256, bytes}} of ``files`` (relative path -> full name), a few at a time."""
        items = sorted(files.items())
        with ThreadPoolExecutor(max_workers=max(1, min(_HASH_THREADS, len(items)))) as pool:
            digests = list(pool.map(lambda item: self.sha256(item[1]), items))
        return {rel: {"sha256": d, "bytes": n} for (rel, _), (d, n) in zip(items, digests, strict=True)}


def writer_rank(rel: str, world: int) -> int:
    """The rank that wrote file ``rel`` of a checkpoint (DCP names a rank's shards ``__<rank>_<n>.distcp``);
    rank 0 for every other file (``.metadata``)."""
    m = re.fullmatch(r"__(\d+)_\d+\.distcp", rel)
    return int(m[1]) % world if m else 0


def hash_written(store: Store, name: str, pg: Any = None,
                 known: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """{relative path: {sha256, bytes}} of the files of ``name``, each rank hashing the files it wrote (while
    they are likely still in its page cache), all at once; every rank gets the whole, or the same
    CheckpointError. Collective under a process group (``pg``: one of every rank, default the default group).
    A file a rank did not see (a slow listing) is missing here: the committer hashes what is missing.
    ``known``: the digests of what this rank wrote, hashed while it was written (an object store: no re-read)."""
    rank, world = group()
    mine: dict[str, dict[str, Any]] = {}
    error = None
    try:
        mine = dict(known) if known is not None else store.hash_files(
            {rel: full for rel, full in store.files(name).items() if writer_rank(rel, world) == rank})
    except ERRORS as e:
        error = describe_failure(e, store.url(name))
    if world == 1:
        if error:
            raise CheckpointError(error)
        return mine
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (mine, error), group=pg)
    error = next((e for _, e in gathered if e), None)
    if error:
        raise CheckpointError(error)
    return {rel: meta for part, _ in gathered for rel, meta in part.items()}


# -- verification -----------------------------------------------------------------------------------------
def _check_share(store: Store, name: str, share: dict[str, dict[str, Any]]) -> None:
    """Sizes first (cheap, and a truncated or missing file needs no hashing), then checksums. On an object store
    the shards' checksums are checked as they are read (:mod:`stoker.train.checkpoint_objects`: each is then
    downloaded once, not twice); ``.metadata``, which loading unpickles, is checked here."""
    paths = {rel: store.join(name, rel) for rel in share}
    sizes = None if store.local else store.sizes(name)  # one listing instead of a HEAD per file
    for rel, meta in share.items():
        size = store.size(paths[rel]) if sizes is None else sizes.get(rel)
        if size is None:
            raise CheckpointError(f"{store.url(name, rel)} is missing: the checkpoint is incomplete; "
                                  "use an earlier one")
        if size != meta["bytes"]:
            raise CheckpointError(f"{store.url(name, rel)} has {size} bytes, its {MANIFEST} says {meta['bytes']}: "
                                  "the checkpoint is truncated or corrupted; use an earlier one")
    rels = sorted(rel for rel in share if store.local or not rel.endswith(".distcp"))
    with ThreadPoolExecutor(max_workers=max(1, min(_HASH_THREADS, len(rels)))) as pool:
        digests = list(pool.map(lambda rel: store.sha256(paths[rel])[0], rels))
    for rel, digest in zip(rels, digests, strict=True):
        if digest != share[rel]["sha256"]:
            raise CheckpointError(f"{store.url(name, rel)} does not match its checksum in {MANIFEST}: "
                                  "the checkpoint is corrupted; use an earlier one")


def verify(store: Store, name: str) -> dict[str, Any]:
    """The manifest of checkpoint ``name`` once every file matches it; CheckpointError (one line, naming the
    checkpoint) if not. Collective under a process group: each rank checks its share of the files."""
    rank, world = group()
    manifest, error = None, None
    try:
        if not store.exists(name, MANIFEST):
            raise CheckpointError(f"{store.url(name)} has no {MANIFEST}: the checkpoint was never committed "
                                  "(torn write); use an earlier checkpoint")
        manifest = parse_manifest(store.read_text(name, MANIFEST), store.url(name, MANIFEST))
        check_signature(manifest, store.url(name, MANIFEST))  # before its checksums vouch for any file
        check_place(manifest, store, name)  # signed: its step is the one it was committed as
        rels = sorted(manifest["files"])
        _check_share(store, name, {rel: manifest["files"][rel] for rel in rels[rank::world]})
        if rank == 0:
            extra = sorted(set(store.files(name)) - set(rels))
            if extra:
                log.warning("checkpoint %s holds %d file(s) its %s does not list (%s): ignored, they are never read",
                            store.url(name), len(extra), MANIFEST, ", ".join(extra[:3]))
    except CheckpointError as e:
        error = one_line(str(e), 1000)
    except Exception as e:  # storage errors
        error = f"cannot read checkpoint {store.url(name)}: {one_line(f'{type(e).__name__}: {e}')}"
    agree(error)
    assert manifest is not None
    return manifest


def candidates(store: Store) -> list[str]:
    """Checkpoint names to try, best first: the one ``latest`` names, then every step_* folder, newest first."""
    names = sorted((n for n in store.list() if is_step_name(n)), reverse=True)
    if store.exists(LATEST):
        pointed = store.read_text(LATEST).strip()
        if is_step_name(pointed):  # a pointer is a checkpoint's name, never a path
            return [pointed] + [n for n in names if n != pointed]
        log.warning("ignoring %s: it holds %r, not a checkpoint name; using the newest valid checkpoint",
                    store.url(LATEST), pointed[:80])
    return names


def newest_valid(store: Store, skipped: list[str] | None = None) -> tuple[str, dict[str, Any]] | None:
    """(name, verified manifest) of the checkpoint to resume from in ``store``: the one ``latest`` names,
    else the newest valid one; every damaged one skipped is named in a warning (and its error appended to
    ``skipped``). Collective under a group."""
    rank, _ = group()
    for name in on_rank0(lambda: candidates(store), store.url()):
        try:
            return name, verify(store, name)
        except CheckpointError as e:
            if skipped is not None:
                skipped.append(str(e))
            if rank == 0:
                log.warning("skipping checkpoint %s: %s", store.url(name), e)
    return None


def split(url: str) -> tuple[str, str]:
    """(checkpoint directory, checkpoint name) of a checkpoint URL."""
    url = url.rstrip("/")
    return tuple(url.rsplit("/", 1)) if "/" in url else (".", url)  # type: ignore[return-value]


def is_checkpoint(url: str) -> bool:
    """Whether ``url`` is one checkpoint (a step folder), not a folder of checkpoints."""
    store = Store(url)
    return (store.exists(MANIFEST) or store.exists(METADATA)
            or (is_step_name(split(url)[1]) and not store.exists(LATEST)))


def find(url: str, what: str) -> tuple[str, dict[str, Any]]:
    """(URL, verified manifest) of the checkpoint ``url`` names: that step folder (refused in one line when
    damaged), or in a checkpoint folder the newest valid one. ``what`` names the setting for messages."""
    url = str(url).rstrip("/")
    if is_checkpoint(url):
        base, name = split(url)
        return url, verify(Store(base), name)
    store = Store(url)
    if store.exists(LATEST) or any(is_step_name(n) for n in store.list()):
        skipped: list[str] = []
        found = newest_valid(store, skipped)
        if found is None:
            keyed = [e for e in skipped if KEY_HINT in e]
            if keyed and len(keyed) == len(skipped):  # the key, not the checkpoints: say so
                raise CheckpointError(f"{what}: no checkpoint in {url} verifies with {KEY_HINT} (the cause is the "
                                      f"key, not damage): {keyed[0]}")
            raise CheckpointError(f"{what}: no valid checkpoint in {url} (each is torn or damaged"
                                  + (f", or signed with another key than {KEY_HINT}" if keyed else "")
                                  + ", see the warnings above); give another checkpoint or start afresh")
        return store.url(found[0]), found[1]
    raise CheckpointError(f"{what}: no committed checkpoint at {url} (no {MANIFEST}, no {LATEST}, no {PREFIX}* "
                          "folder); give a step_XXXXXXXX folder or a checkpoint directory")
