"""Staging a store URL to this node's local disk before a command starts (`current.torch.run(stage=[...])`).

Training scripts written for local files (NeuronX Distributed's Llama scripts assert `os.path.exists(data_dir)`
and call `datasets.load_from_disk`) cannot read `s3://...`. Staging copies the prefix to a folder on the node and
hands the command that path:

- the objects move through the store's object layer (`stoker.store.objects`): parallel files, each large one in
  parallel ranges, `$STOKER_S3_*` honoured;
- every file is verified against the sha256 the prefix's `manifest.json` records (stoker's datasets in either
  format write one); a file the manifest records but the prefix lacks is refused, by name; a file the prefix holds
  but the manifest does not record is checked by size only, and the report counts it ("3 of 4 files verified");
  a prefix without a manifest is checked by size only, and the report says so;
- what no retry can mend is refused as :class:`UnusableDataset`, a permanent error (never retried by `@retry`: a
  new attempt on Batch is a new boot and image pull for the same answer): an empty prefix, a recorded file missing,
  a file that fails its sha256 again when downloaded a second time;
- the copy is cached on the node under `$STOKER_STAGE_DIR` (default `/var/tmp/stoker-stage`, a host folder the
  Batch job definition mounts, so a retry on the same instance reuses it), keyed by the URL and what the listing
  says of every object (size and ETag): a changed object is a new copy. A folder appears whole or not at all
  (downloaded under a temporary name, then renamed), so nodes or ranks staging at once never see half of one;
- a local path (or `file://`) is used where it is, after checking it exists.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from stoker._hashing import SHA256, key_algo
from stoker.errors import ConfigError, DataError
from stoker.store.objects import ObjectInfo, ObjectStore, open_objects

DEFAULT_STAGE_DIR = "/var/tmp/stoker-stage"
MANIFEST = "manifest.json"
DONE = ".stoker-staged.json"  # written last in a staged folder: what it holds and where from


class UnusableDataset(DataError):
    """The prefix cannot be staged as it is, and staging it again cannot help (empty, a recorded file missing, a
    file that fails its sha256 twice): permanent, so the scheduler does not retry it (stoker.exitstatus)."""

    permanent = True


def stage_root(env: dict[str, str] | os._Environ | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get("STOKER_STAGE_DIR") or DEFAULT_STAGE_DIR).expanduser()


def is_store_url(value: object) -> bool:
    """True for a URL the object layer reaches that is not a local path (`s3://`, `gs://`, `memory://` ...)."""
    return isinstance(value, str) and "://" in value and not value.startswith("file://")


@dataclass(frozen=True)
class Staged:
    """One staged input: the local `path` the command gets, and what it cost."""

    url: str
    path: str
    files: int
    bytes: int
    seconds: float
    cached: bool
    verified: bool  # every file but manifest.json checked against a recorded sha256
    checked: int = 0  # how many files were checked against a recorded sha256
    unrecorded: tuple[str, ...] = ()  # files (but manifest.json) the manifest does not record: sizes only

    def summary(self) -> str:
        if self.url == self.path or not is_store_url(self.url):
            return f"stage: {self.path} is a path on this node: used where it is (not copied, not verified)"
        mb = self.bytes / 1e6
        if self.cached:
            how = f"cached on this node ({self.files} files, {mb:,.1f} MB)"
        else:
            rate = f", {mb / self.seconds:,.0f} MB/s" if self.seconds > 0 else ""
            how = f"{self.files} files, {mb:,.1f} MB in {self.seconds:.1f} s{rate}"
        return f"stage: {self.url} -> {self.path}: {how}, {self._check()}"

    def _check(self) -> str:
        if not self.checked:
            return "NOT verified: no manifest.json with checksums, sizes only"
        if not self.unrecorded:
            return f"all {self.checked} files verified (sha256)"
        names = ", ".join(self.unrecorded[:3]) + (f" and {len(self.unrecorded) - 3} more"
                                                  if len(self.unrecorded) > 3 else "")
        return (f"{self.checked} of {self.checked + len(self.unrecorded)} files verified (sha256); not in "
                f"manifest.json, sizes only: {names}")


def _recorded(store: ObjectStore, listing: list[ObjectInfo], url: str) -> dict[str, str]:
    """sha256 per key from the prefix's manifest.json (stoker's token shards, or a `files` list), {} without one."""
    if not any(o.key == MANIFEST for o in listing):
        return {}
    try:
        doc = json.loads(store.get_bytes(MANIFEST))
    except (ValueError, UnicodeDecodeError):
        raise DataError(f"{url}/{MANIFEST} is not JSON: the prefix holds a damaged dataset; prepare it again "
                        f"(stoker data prepare ... --output {url})") from None
    out: dict[str, str] = {}
    for f in doc.get("files") or []:
        if isinstance(f, dict) and f.get("path") and f.get("sha256"):
            out[str(f["path"])] = str(f["sha256"])
    for split in (doc.get("splits") or {}).values():
        for shard in split.get("shards") or []:
            if shard.get("path") and shard.get("sha256"):
                out[str(shard["path"])] = str(shard["sha256"])
    return out


def _cache_key(url: str, listing: list[ObjectInfo]) -> str:
    h = hashlib.sha256(url.rstrip("/").encode())
    for o in listing:
        h.update(f"\0{o.key}\0{o.size}\0{o.etag}".encode())
    return h.hexdigest()[:20]


def _name_of(url: str) -> str:
    tail = url.rstrip("/").rsplit("/", 1)[-1] or "data"
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in tail)[:60]


def stage(url: str, *, root: str | os.PathLike | None = None, store: ObjectStore | None = None) -> Staged:
    """Copy the prefix `url` to this node (see the module docstring) and return where it is.

    Raises DataError naming the URL when it holds nothing, a file fails its recorded sha256, or the disk is
    too small; ConfigError for a local path that does not exist."""
    started = time.monotonic()
    if not is_store_url(url):
        local = Path(url[len("file://"):] if url.startswith("file://") else url).expanduser()
        if not local.exists():
            raise ConfigError(f"stage: {url} does not exist on this node; give a store URL (s3://...) that every "
                              f"node can read, or a path on a disk the nodes share")
        return Staged(url, str(local), 0, 0, 0.0, cached=True, verified=True)
    store = store or open_objects(url.rstrip("/"), error=DataError)
    listing = [o for o in store.list("") if not o.key.endswith("/")]
    if not listing:
        raise UnusableDataset(f"stage: {url} holds no objects; check the URL, or write the dataset there first "
                              f"(stoker data prepare ... --output {url})")
    sums = _recorded(store, listing, url.rstrip("/"))
    _refuse_missing(url, sums, listing)
    unrecorded = tuple(o.key for o in listing if o.key != MANIFEST and o.key not in sums) if sums else ()
    total = sum(o.size for o in listing)
    base = Path(root) if root is not None else stage_root()
    dest = base / f"{_name_of(url)}-{_cache_key(url, listing)}"
    checks = {"verified": bool(sums) and not unrecorded, "checked": len(sums), "unrecorded": unrecorded}
    if (dest / DONE).is_file():
        return Staged(url, str(dest), len(listing), total, time.monotonic() - started, cached=True, **checks)
    base.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(base).free
    if free < total:
        raise DataError(f"stage: {url} is {total / 1e9:,.2f} GB but {base} has {free / 1e9:,.2f} GB free on this "
                        f"node; free space there, point STOKER_STAGE_DIR at a larger disk, or raise the instance's "
                        f"root volume (root_volume_gb in stoker-infra.toml)")
    tmp = base / f".{dest.name}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        wanted = []
        for o in listing:
            local = tmp / o.key
            if not local.resolve().is_relative_to(tmp.resolve()):
                raise UnusableDataset(f"stage: {url} has an object named {o.key!r}, which leads out of its folder")
            local.parent.mkdir(parents=True, exist_ok=True)
            wanted.append((o.key, local, sums.get(o.key)))
        _download(store, url, wanted)
        for o in listing:  # without a recorded sha256, at least the size the listing promised
            got = (tmp / o.key).stat().st_size
            if got != o.size:
                raise store.wrong_size(o.key, got, o.size)
        (tmp / DONE).write_text(json.dumps({"url": url, "files": len(listing), "bytes": total,
                                            "verified": checks["verified"], "checked": len(sums),
                                            "unrecorded": list(unrecorded)}))
        try:
            os.rename(tmp, dest)
        except OSError:  # another process on this node finished the same copy first
            if not (dest / DONE).is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Staged(url, str(dest), len(listing), total, time.monotonic() - started, cached=False, **checks)


def _refuse_missing(url: str, sums: dict[str, str], listing: list[ObjectInfo]) -> None:
    """A file the manifest records but the prefix lacks: the dataset is incomplete, whatever stages."""
    missing = sorted(set(sums) - {o.key for o in listing})
    if missing:
        names = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise UnusableDataset(f"stage: {url} lacks {names}, which its {MANIFEST} records: the dataset is "
                              f"incomplete; prepare it again (stoker data prepare ... --output {url})")


def _download(store: ObjectStore, url: str, wanted: list[tuple[str, Path, str | None]]) -> None:
    """Download (key, local path, sha256 or None) triples. A failed or damaged transfer is tried once more, one
    file at a time; a file whose content fails its recorded sha256 a second time is damaged in storage: permanent."""
    try:
        store.get_many(wanted)
        return
    except DataError:
        pass  # (get_file renames a file into place only once it is whole and verified: those stay)
    for key, local, sha in wanted:
        if local.is_file():
            continue
        if sha is None:
            store.get_file(key, local)
            continue
        got = store.get_file(key, local, algo=key_algo(sha) or SHA256)
        if got != sha:
            local.unlink(missing_ok=True)
            raise UnusableDataset(f"stage: {url}/{key} does not match the sha256 its {MANIFEST} records, downloaded "
                                  f"twice (it hashes to {str(got)[:16]}..., the record says {sha[:16]}...): it is "
                                  f"damaged or was overwritten in storage; prepare the dataset again "
                                  f"(stoker data prepare ... --output {url})")
