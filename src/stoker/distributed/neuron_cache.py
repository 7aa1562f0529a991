"""The Neuron compile cache as a prefix of the store, so compiled graphs survive from one run (and node) to
the next instead of being lost with every container.

Layout under the prefix (default `neuron-cache/`): one small marker object per cached file,
`<prefix><path in the cache>@<sha256>`, whose file content is the blob `<sha256>` (the marker holds its
upload time). A listing of the prefix is the whole index (no per-file reads), identical files are stored
once, concurrent uploads from every node of a gang never conflict (the same file gives the same name), and
when a file changed the newest upload wins.

- `fetch(store, prefix, local_dir)` before training: downloads what is missing locally, then removes the
  locks no live process holds and the unfinished entries they guarded, left by a killed run on this disk
  (`clean_stale`; compilations in progress, e.g. other nodes on a shared file system, are left alone);
- `upload(store, prefix, local_dir)` after training (also after a failure): uploads only new or changed
  files of *finished* compilations. Skipped: `*.lock` files and anything inside a `*.lock` folder, and the
  entries neuronx-cc has not finished (no `model.done`, and no `model.neff` outside a lock): in progress,
  or marked failed because the run was killed mid-compilation. A killed run never poisons the next one.

The local folder is the one Neuron uses: `--cache_dir=` in `NEURON_CC_FLAGS` (Neuron gives it precedence),
else `NEURON_COMPILE_CACHE_URL`, else `/var/tmp/neuron-compile-cache` (`local_cache_dir`).
"""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from stoker._hashing import sha256_file
from stoker.distributed.accel import NEURON_CACHE_DIR
from stoker.errors import StoreError
from stoker.store.blobs import BlobStore, check_name

DEFAULT_PREFIX = "neuron-cache/"
WORKERS = 8
_KEY = re.compile(r"[0-9a-f]{64}")
DONE, NEFF = "model.done", "model.neff"
STALE_LOCK_DIR_S = 3600.0  # a `*.lock` folder (no owner to ask) older than this is left over


@dataclass
class SyncReport:
    """What one fetch or upload did (`summary()` is the line printed in the task's log)."""

    action: str
    files: int = 0
    bytes: int = 0
    unchanged: int = 0
    skipped: list[str] = field(default_factory=list)  # "path (why)"
    removed: list[str] = field(default_factory=list)  # local stale locks / unfinished entries
    seconds: float = 0.0

    def summary(self) -> str:
        parts = [f"{self.action} {self.files} files ({self.bytes / 1e6:.1f} MB) in {self.seconds:.1f} s",
                 f"{self.unchanged} unchanged"]
        if self.skipped:
            parts.append(f"skipped {len(self.skipped)}: {', '.join(self.skipped[:3])}"
                         + (" ..." if len(self.skipped) > 3 else ""))
        if self.removed:
            parts.append(f"removed {len(self.removed)} stale: {', '.join(self.removed[:3])}"
                         + (" ..." if len(self.removed) > 3 else ""))
        return "; ".join(parts)


def normalize_prefix(prefix: str) -> str:
    """`neuron-cache` -> `neuron-cache/` (a valid object name prefix, or StoreError naming the fix)."""
    p = str(prefix).strip().strip("/")
    if not p:
        raise StoreError("the Neuron cache prefix is empty; use a folder name such as 'neuron-cache/'")
    check_name(p)
    return p + "/"


def local_cache_dir(env: Mapping[str, str] | None = None) -> Path | None:
    """The folder Neuron compiles into, or None when Neuron's own cache URL is remote (s3://: Neuron syncs it
    itself, stoker leaves it alone)."""
    env = os.environ if env is None else env
    url = None
    try:
        flags = shlex.split(env.get("NEURON_CC_FLAGS", ""))
    except ValueError:
        flags = env.get("NEURON_CC_FLAGS", "").split()
    for i, f in enumerate(flags):
        if f.startswith("--cache_dir="):
            url = f.split("=", 1)[1]
        elif f == "--cache_dir" and i + 1 < len(flags):
            url = flags[i + 1]
    url = url or env.get("NEURON_COMPILE_CACHE_URL") or NEURON_CACHE_DIR
    if "://" in url and not url.startswith("file://"):
        return None
    return Path(os.path.expanduser(url.removeprefix("file://")))


def _is_lock(name: str) -> bool:
    return name.endswith(".lock")


def _entry_state(dirname: str, files: list[str]) -> str | None:
    """A folder of the cache: None (not a compile entry: neither `MODULE_*` nor holding `model.*` files),
    "done", or "unfinished" (in progress, or failed / interrupted)."""
    if not dirname.startswith("MODULE_") and not any(f.startswith("model.") for f in files):
        return None
    if DONE in files or (NEFF in files and not any(_is_lock(f) for f in files)):
        return "done"
    return "unfinished"


def cache_files(local_dir: str | os.PathLike) -> tuple[list[str], list[str]]:
    """(files worth keeping, skipped with why) under `local_dir`, as relative POSIX paths."""
    root = Path(local_dir)
    keep: list[str] = []
    skipped: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        prefix = "" if rel_dir == "." else rel_dir + "/"
        for d in [d for d in dirnames if _is_lock(d)]:
            skipped.append(f"{prefix}{d}/ (lock)")
        dirnames[:] = sorted(d for d in dirnames if not _is_lock(d))
        if rel_dir != "." and _entry_state(Path(dirpath).name, filenames) == "unfinished":
            skipped.append(f"{prefix} (unfinished compilation)")
            dirnames[:] = []
            continue
        for f in sorted(filenames):
            path = Path(dirpath, f)
            if _is_lock(f):
                skipped.append(f"{prefix}{f} (lock)")
            elif path.is_symlink() or not path.is_file():
                skipped.append(f"{prefix}{f} (not a regular file)")
            else:
                keep.append(prefix + f)
    return keep, skipped


def lock_is_live(path: str | os.PathLike) -> bool:
    """Whether a process holds the lock file (neuronx-cc's locks are flock()ed while it compiles; the kernel
    drops them when the process dies, however it dies). When that cannot be told, say live: never break a
    running compilation."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # e.g. ENOLCK on a file system without flock
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def clean_stale(local_dir: str | os.PathLike, *, lock_dir_age_s: float = STALE_LOCK_DIR_S) -> list[str]:
    """Remove what a killed run left in a cache folder: lock files no process holds, `*.lock` folders older
    than `lock_dir_age_s`, and entries whose compilation never finished and that no live lock guards
    (neuronx-cc would wait on the lock, or report a cached failure). Live compilations are left alone, so a
    cache on a shared file system is safe to clean while other nodes compile into it."""
    root = Path(local_dir)
    removed: list[str] = []
    if not root.is_dir():
        return removed
    now = time.time()
    for dirpath, dirnames, filenames in os.walk(root, topdown=True):
        here = Path(dirpath)
        rel = "" if here == root else here.relative_to(root).as_posix() + "/"
        live = {f for f in filenames if _is_lock(f) and lock_is_live(here / f)}
        for f in sorted(f for f in filenames if _is_lock(f) and f not in live):
            (here / f).unlink(missing_ok=True)
            removed.append(rel + f)
        for d in [d for d in dirnames if _is_lock(d)]:
            try:
                old = now - (here / d).stat().st_mtime > lock_dir_age_s
            except OSError:
                old = False
            if old:
                shutil.rmtree(here / d, ignore_errors=True)
                removed.append(f"{rel}{d}/")
        dirnames[:] = sorted(d for d in dirnames if not _is_lock(d))
        for d in list(dirnames):
            entry = here / d
            try:
                files = [f.name for f in entry.iterdir() if f.is_file()]
            except OSError:
                continue
            guarded = (d + ".lock") in live or any(_is_lock(f) and lock_is_live(entry / f) for f in files)
            if _entry_state(d, files) == "unfinished" and not guarded:  # a dead lock inside: killed mid-way
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(f"{rel}{d}/")
                dirnames.remove(d)
    return removed


def remote_index(store: BlobStore, prefix: str) -> dict[str, list[str]]:
    """{relative path: [blob keys]} from one listing of the prefix (several keys when nodes disagreed)."""
    prefix = normalize_prefix(prefix)
    index: dict[str, list[str]] = {}
    for name in store.list(prefix):
        rel, sep, key = name[len(prefix):].rpartition("@")
        if sep and rel and _KEY.fullmatch(key):
            index.setdefault(rel, []).append(key)
    return index


def _newest(store: BlobStore, prefix: str, rel: str, keys: list[str]) -> str:
    """The last uploaded of several versions of a file (each marker holds its upload time; rare: one read
    per version, only for files that changed or that nodes compiled differently)."""
    if len(keys) == 1:
        return keys[0]

    def stamp(key: str) -> int:
        try:
            return int(store.read(f"{normalize_prefix(prefix)}{rel}@{key}") or b"0")
        except (StoreError, ValueError):
            return 0

    return max(keys, key=lambda k: (stamp(k), k))


def _pool(jobs: list[Callable[[], int]]) -> list[int]:
    if not jobs:
        return []
    with ThreadPoolExecutor(max_workers=min(WORKERS, len(jobs))) as ex:
        return list(ex.map(lambda job: job(), jobs))


def fetch(store: BlobStore, prefix: str, local_dir: str | os.PathLike, *, clean: bool = True) -> SyncReport:
    """Bring the cached compilations of `prefix` into `local_dir` (files already there and equal are kept),
    then (clean=True) remove stale locks and unfinished entries (`clean_stale`)."""
    started = time.time()
    root = Path(local_dir)
    root.mkdir(parents=True, exist_ok=True)
    report = SyncReport("fetched")
    index = remote_index(store, prefix)
    resolved_root = root.resolve()

    def get(rel: str, key: str) -> int:
        dest = root / rel
        if not dest.resolve().is_relative_to(resolved_root):
            raise StoreError(f"Neuron cache entry {rel!r} in {store.url} points outside {root}; delete it")
        if dest.is_file() and sha256_file(dest) == key:
            return -1
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".stoker-")
        os.close(fd)
        try:
            shutil.copyfile(store.blob_path(key), tmp)
            os.chmod(tmp, 0o644)
            os.replace(tmp, dest)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return dest.stat().st_size

    jobs = [lambda rel=rel, key=_newest(store, prefix, rel, keys): get(rel, key)
            for rel, keys in sorted(index.items()) if not any(_is_lock(part) for part in rel.split("/"))]
    for n in _pool(jobs):
        if n < 0:
            report.unchanged += 1
        else:
            report.files += 1
            report.bytes += n
    if clean:
        report.removed = clean_stale(root)
    report.seconds = time.time() - started
    return report


def upload(store: BlobStore, prefix: str, local_dir: str | os.PathLike) -> SyncReport:
    """Store the finished compilations of `local_dir` under `prefix`: only files the store lacks (or holds
    an older version of). Locks and unfinished entries are skipped (`cache_files`)."""
    started = time.time()
    prefix = normalize_prefix(prefix)
    root = Path(local_dir)
    report = SyncReport("uploaded")
    if not root.is_dir():
        report.seconds = time.time() - started
        return report
    keep, report.skipped = cache_files(root)
    index = remote_index(store, prefix)

    def put(rel: str) -> int:
        path = root / rel
        key = sha256_file(path)
        known = index.get(rel, [])
        if key in known and (len(known) == 1 or _newest(store, prefix, rel, known) == key):
            return -1
        key = store.put_blob_file(path)  # the content may have changed since hashing: name what was stored
        store.write(f"{prefix}{rel}@{key}", str(time.time_ns()).encode())  # newest wins on fetch
        return path.stat().st_size

    for n in _pool([lambda rel=rel: put(rel) for rel in keep]):
        if n < 0:
            report.unchanged += 1
        else:
            report.files += 1
            report.bytes += n
    report.seconds = time.time() - started
    return report
