"""The on-disk layout of a prepared dataset, the :class:`DatasetRef` handed between steps, and the
helpers that commit and fetch it (remote ones through :mod:`stoker.store.objects`).

Layout (a folder or an object-store prefix)::

    manifest.json                 written last: its presence means the dataset is committed
    train/shard-00000.bin ...     flat little-endian uint16 (vocab <= 65536) or uint32 token ids
    val/shard-00000.bin ...       (when a validation split was requested)

``--format hf`` writes a Hugging Face ``save_to_disk`` folder instead (see :mod:`stoker.data.hf_export`), with
the same ``manifest.json`` (format ``stoker.hf/1``) that also lists every file and its sha256 under ``files``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from stoker.errors import DataError
from stoker.store.objects import ObjectStore, open_objects

logger = logging.getLogger(__name__)

FORMAT = "stoker.tokens/1"
HF_FORMAT = "stoker.hf/1"  # --format hf: a datasets save_to_disk folder (stoker.data.hf_export)
FORMATS = {"stoker": FORMAT, "hf": HF_FORMAT}  # --format NAME -> the manifest's format
MANIFEST = "manifest.json"


def home_dir() -> Path:
    """``$STOKER_HOME`` or ``./.stoker``."""
    return Path(os.environ.get("STOKER_HOME") or ".stoker").expanduser().resolve()


def default_dataset_url(fingerprint: str) -> str:
    """Where a prepared dataset goes when no output is given: next to the run store when that is remote
    (``$STOKER_STORE=s3://b/p`` -> ``s3://b/p/datasets/FP``, so cluster nodes can read it), else
    ``<home>/datasets/FP``."""
    store = os.environ.get("STOKER_STORE", "")
    if is_remote(store):
        return f"{store.rstrip('/')}/datasets/{fingerprint}"
    return str(home_dir() / "datasets" / fingerprint)


def is_remote(url: str) -> bool:
    """True for fsspec URLs other than ``file://`` (``s3://``, ``memory://`` ...)."""
    return "://" in url and not url.startswith("file://")


def local_path(url: str) -> Path:
    """The folder behind a local path or ``file://`` URL."""
    return Path(url[len("file://"):] if url.startswith("file://") else url).expanduser().resolve()


def objects(url: str) -> ObjectStore:
    """The object store at a remote ``url`` (``s3://`` through boto3, honouring ``$STOKER_S3_ENDPOINT_URL``;
    other fsspec URLs through their driver); its failures are DataErrors."""
    return open_objects(url.rstrip("/"), error=DataError)


@dataclass(frozen=True)
class DatasetRef:
    """A committed dataset: where it is and its manifest. Small and picklable (stored as a flow artifact)."""

    url: str
    fingerprint: str
    manifest: dict = field(repr=False, hash=False)

    @property
    def path(self) -> Path | None:
        """The local folder, or None when the dataset lives in an object store."""
        return None if is_remote(self.url) else local_path(self.url)

    @property
    def block_size(self) -> int:
        return int(self.manifest["block_size"])

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["tokenizer"]["vocab_size"])

    @property
    def num_tokens(self) -> int:
        """Tokens stored in the train split (whole blocks)."""
        return int(self.manifest["splits"]["train"]["num_tokens"])

    @property
    def splits(self) -> list[str]:
        return sorted(self.manifest["splits"])

    @property
    def format(self) -> str:
        """``"stoker"`` (token shards, :func:`~stoker.data.open_dataset`) or ``"hf"`` (a ``save_to_disk``
        folder at :attr:`url`, :func:`~stoker.data.hf_export.load_hf_dataset`)."""
        return "hf" if self.manifest.get("format") == HF_FORMAT else "stoker"

    def num_blocks(self, split: str = "train") -> int:
        return int(self.manifest["splits"][split]["num_blocks"])

    def __str__(self) -> str:
        return self.url


_FINGERPRINT = re.compile(r"[0-9A-Za-z_-]{1,128}")


def _bad(where: str, entry: str, why: str) -> DataError:
    return DataError(f"{where}: refusing {entry} ({why}); a dataset manifest may only name files inside its own "
                     "dataset folder by relative paths like 'train/shard-00000.bin'. The manifest was not written "
                     "by `stoker data prepare` (or was tampered with); prepare the dataset again with "
                     "--overwrite and check who can write to its location")


def safe_relative(path, where: str, entry: str) -> str:
    """``path`` (a file name read from the manifest at ``where``) if it stays inside the dataset folder:
    a non-empty relative POSIX path without ``..``/``.``, empty parts, backslashes, NUL or a drive."""
    if not isinstance(path, str) or not path:
        raise _bad(where, f"{entry}={path!r}", "not a non-empty string")
    if path.startswith("/") or "\\" in path or "\x00" in path or re.match(r"[A-Za-z]:", path):
        raise _bad(where, f"{entry}={path!r}", "an absolute path, a drive, a backslash or a NUL")
    for part in path.split("/"):
        if part in ("", ".", ".."):
            raise _bad(where, f"{entry}={path!r}", f"an {'empty' if not part else repr(part)} path part")
    return path


def check_manifest(manifest: dict, where: str) -> dict:
    """Refuse a manifest whose structure is not a dataset's or whose fingerprint or shard paths could
    name anything outside the dataset folder (a manifest can come from a shared or remote store)."""
    fp = manifest.get("fingerprint")
    if not isinstance(fp, str) or not _FINGERPRINT.fullmatch(fp):
        raise _bad(where, f"fingerprint={fp!r}", "not a plain name of letters, digits, '-' or '_'")
    splits = manifest.get("splits")
    if not isinstance(splits, dict):
        raise _bad(where, f"splits={type(splits).__name__}", "not a mapping of split names")
    for name, split in splits.items():
        shards = split.get("shards") if isinstance(split, dict) else None
        if not isinstance(shards, list) or not all(isinstance(sh, dict) for sh in shards):
            raise _bad(where, f"splits[{name!r}]", "no list of shard entries")
        for i, shard in enumerate(shards):
            safe_relative(shard.get("path"), where, f"splits[{name!r}].shards[{i}].path")
    files = manifest.get("files", [])
    if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
        raise _bad(where, f"files={type(files).__name__}", "not a list of file entries")
    for i, entry in enumerate(files):
        safe_relative(entry.get("path"), where, f"files[{i}].path")
    return manifest


def parse_manifest(text: str, where: str) -> dict:
    try:
        manifest = json.loads(text)
    except ValueError as exc:
        raise DataError(f"{where} is not valid JSON ({exc}): the dataset is corrupted; prepare it again "
                        "with overwrite=True (--overwrite)") from None
    if not isinstance(manifest, dict) or manifest.get("format") not in FORMATS.values():
        raise DataError(f"{where} is not a stoker dataset manifest (format {FORMAT!r} or {HF_FORMAT!r}); prepare "
                        "the dataset with `stoker data prepare`")
    return check_manifest(manifest, where)


def read_manifest(url: str) -> dict | None:
    """The committed manifest at ``url``, or None when nothing is committed there."""
    if is_remote(url):
        data = objects(url).try_get_bytes(MANIFEST)
        return None if data is None else parse_manifest(data.decode(), f"{url.rstrip('/')}/{MANIFEST}")
    path = local_path(url) / MANIFEST
    if not path.is_file():
        return None
    return parse_manifest(path.read_text(), str(path))


def write_manifest(folder: Path, manifest: dict) -> None:
    tmp = folder / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    os.replace(tmp, folder / MANIFEST)


def staging_dir(target: str) -> Path:
    """A private folder to write into before committing to ``target`` (same filesystem when local)."""
    if is_remote(target):
        base = home_dir() / "tmp"
        base.mkdir(parents=True, exist_ok=True)
        return base / f"prepare-{uuid.uuid4().hex[:12]}"
    dest = local_path(target)
    dest.parent.mkdir(parents=True, exist_ok=True)
    return dest.parent / f".{dest.name}.tmp-{uuid.uuid4().hex[:12]}"


def commit(staging: Path, target: str, *, overwrite: bool = False) -> None:
    """Publish ``staging`` at ``target`` atomically: a rename locally; shards then manifest remotely."""
    if is_remote(target):
        _upload(staging, target, overwrite=overwrite)
        shutil.rmtree(staging, ignore_errors=True)
        return
    dest = local_path(target)
    trash = None
    if dest.exists():
        if not overwrite:
            raise DataError(f"{dest} already exists and holds another dataset; pass overwrite=True "
                            "(--overwrite) or another output")
        trash = dest.parent / f".{dest.name}.old-{uuid.uuid4().hex[:12]}"
        os.rename(dest, trash)
    os.rename(staging, dest)  # atomic on one filesystem: readers see all of it or nothing
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


def _upload(staging: Path, target: str, *, overwrite: bool) -> None:
    store = objects(target)
    if store.exists(MANIFEST):
        if not overwrite:
            raise DataError(f"{target} already holds a dataset; pass overwrite=True (--overwrite) or another output")
        store.delete(MANIFEST)  # uncommit first so no reader sees old manifest over new shards
    files = [(file.relative_to(staging).as_posix(), file) for file in sorted(staging.rglob("*"))
             if file.is_file() and file.name != MANIFEST]
    try:
        store.put_many(files)  # shards in parallel (each in parallel parts when large)
        store.put_file(MANIFEST, staging / MANIFEST)  # the commit point
    except BaseException:
        try:  # best effort: leave nothing half-written behind
            store.delete_many([key for key, _ in files])
        except Exception:  # noqa: BLE001 - the original error matters more
            logger.warning("could not remove the partial upload at %s", target)
        raise


def download(url: str, manifest: dict, dest: Path) -> None:
    """Copy a committed remote dataset to the local folder ``dest`` (atomically), shards in parallel, each
    verified against the sha256 its manifest records (every file its ``files`` lists, when it has one)."""
    check_manifest(manifest, f"{url.rstrip('/')}/{MANIFEST}")  # its paths decide where files are written
    store = objects(url)
    tmp = dest.parent / f".{dest.name}.tmp-{uuid.uuid4().hex[:12]}"
    tmp.mkdir(parents=True)
    try:
        wanted = []
        entries = manifest.get("files") or [shard for split in manifest["splits"].values() for shard in split["shards"]]
        for shard in entries:
            local = tmp / shard["path"]
            if not local.resolve().is_relative_to(tmp.resolve()):  # belt and braces after check_manifest
                raise _bad(f"{url.rstrip('/')}/{MANIFEST}", repr(shard["path"]), "it leads out of the dataset")
            local.parent.mkdir(parents=True, exist_ok=True)
            wanted.append((shard["path"], local, shard.get("sha256")))
        store.get_many(wanted)
        write_manifest(tmp, manifest)
        try:
            os.rename(tmp, dest)
        except OSError:  # another process finished first
            if not (dest / MANIFEST).is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
