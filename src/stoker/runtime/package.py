"""The code package: a content-addressed tarball of the flow's folder and its local imports.

A remote node unpacks it and runs the same `python flow.py _task SPEC` as a local task, so changing code or
hyperparameters never needs a new image. The tarball is deterministic (sorted names, fixed times and
owners): the same code gives the same key, and a node that has unpacked it once reuses it.
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from stoker.errors import ConfigError, StokerError
from stoker.store.blobs import BlobStore

if TYPE_CHECKING:  # tarfile and gzip are imported where used: a local run never builds a package
    import tarfile

SKIP_DIRS = {".git", ".hg", ".stoker", "__pycache__", ".venv", "venv", "node_modules", ".mypy_cache",
             ".pytest_cache", ".ruff_cache", ".ipynb_checkpoints"}
SECRET_HINTS = ("secret", "credential", "token", "passw", "apikey", "api_key", "private", ".env", "netrc")
SUFFIXES = {".py", ".toml", ".json", ".yaml", ".yml", ".txt", ".cfg", ".ini", ".sh", ".md", ".jinja", ".j2"}
MAX_FILE = 1 << 20  # bigger files are data, not code: put them in the store or a dataset
MAX_TOTAL = 64 << 20


def _walk_flow_dir(root: Path) -> dict[str, Path]:
    files: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".")
                             and not (here / d / "pyvenv.cfg").exists())
        for name in filenames:
            p = here / name
            secret = any(h in name.lower() for h in SECRET_HINTS)  # never ship keys to a shared store
            if p.suffix in SUFFIXES and not secret and p.is_file() and p.stat().st_size <= MAX_FILE:
                files[p.relative_to(root).as_posix()] = p
    return files


def _system_roots() -> list[Path]:
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots |= {sys.prefix, sys.base_prefix, sys.exec_prefix}
    return [Path(r).resolve() for r in roots]


def _local_imports(exclude: list[Path]) -> dict[str, Path]:
    """Modules imported from folders on sys.path that are not Python's own or an installed package's
    (`from mylib import x` next to the flow, or a project's `src/`)."""
    system = _system_roots() + [Path(__file__).resolve().parents[1]]  # stoker itself is installed on nodes
    roots = [Path(p).resolve() for p in sys.path if p and os.path.isdir(p)]
    roots = [r for r in roots if not any(r == s or s in r.parents for s in system)]
    found: dict[str, Path] = {}
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if not f or not f.endswith(".py") or not os.path.isabs(f) or not os.path.isfile(f):
            continue  # built-in, generated (a relative or missing __file__), or not Python source
        path = Path(f).resolve()
        if any(s in path.parents for s in system) or any(e in path.parents for e in exclude):
            continue
        root = next((r for r in roots if r in path.parents), None)
        if root is None:
            continue
        rel = path.relative_to(root)
        found[rel.as_posix()] = path
        for parent in rel.parents:  # the package's __init__ files come along
            init = root / parent / "__init__.py"
            if parent != Path(".") and init.exists():
                found[(parent / "__init__.py").as_posix()] = init
    return found


def build_package(flow_file: str | os.PathLike) -> tuple[bytes, str]:
    """(tar.gz bytes, the flow file's path inside the package)."""
    flow = Path(flow_file).resolve()
    root = flow.parent
    files = _local_imports(exclude=[root])
    files.update(_walk_flow_dir(root))  # the flow's own folder wins a name clash
    total = sum(p.stat().st_size for p in files.values())
    if total > MAX_TOTAL:
        raise ConfigError(f"the code package of {flow} would be {total >> 20} MB (limit {MAX_TOTAL >> 20} MB): "
                          f"move data files out of {root} into the store or a dataset")
    import gzip
    import tarfile

    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=6, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w") as tar:  # mtime=0: the same code gives the same bytes
        for name in sorted(files):
            data = files[name].read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue(), flow.name


def stage_package(store: BlobStore, flow_file: str | os.PathLike) -> tuple[str, str]:
    """Put the code package in the store; returns (blob key, flow path inside the package)."""
    data, flow_path = build_package(flow_file)
    return store.put_blob(data), flow_path


def cache_root() -> Path:
    return Path(os.environ.get("STOKER_CODE_CACHE") or Path.home() / ".cache" / "stoker" / "code")


def unpack_package(store: BlobStore, key: str, root: Path | None = None) -> Path:
    """The package's folder on this node, unpacked once per key (atomically: concurrent members are safe)."""
    import tarfile

    root = root or cache_root()
    dest = root / key
    if dest.is_dir():
        return dest
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=root))
    try:
        with tarfile.open(fileobj=io.BytesIO(store.get_blob(key)), mode="r:gz") as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tmp, filter="data")
            else:  # Python < 3.11.4 / 3.10.12 (e.g. Debian 12's 3.11.2): the same checks, for what packages hold
                tar.extractall(tmp, members=_plain_members(tar, key))
        os.replace(tmp, dest)
    except OSError:
        if not dest.is_dir():  # not another member that won the rename
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _plain_members(tar: tarfile.TarFile, key: str) -> list[tarfile.TarInfo]:
    """A code package's members, refusing what the "data" extraction filter refuses and packages never hold:
    links, devices, absolute paths and names that climb out with ``..``."""
    members = tar.getmembers()
    for m in members:
        parts = Path(m.name).parts
        if not (m.isfile() or m.isdir()) or m.name.startswith(("/", "\\")) or ".." in parts:
            raise StokerError(f"code package {key[:12]} holds {m.name!r}, which no stoker package holds (a link, a "
                              "device, or a path outside the package): it was not made by stoker; not unpacked")
        m.mode &= 0o755
    return members
