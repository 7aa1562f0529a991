"""Objects as files under a local folder (:class:`LocalObjects`): the one place stoker writes a file under a
temporary name, fsyncs it and renames it into place."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from stoker._hashing import SHA256
from stoker.errors import StokerError, StoreError
from stoker.store.objects.base import ObjectInfo, ObjectStore, TransferConfig, check_object_key


class LocalObjects(ObjectStore):
    """Objects as files under a local folder; every write is a temporary file renamed into place, so a reader
    sees the old content or the new one, never a torn file.

    ``staging``: a folder under the root (e.g. ``".tmp"``) that holds every temporary file (then it is never
    listed); without it a temporary file is written beside its object. ``unlisted``: top-level folders that a
    listing walks only when its prefix names them (a blob store's ``blobs``). A ``durable`` write fsyncs the
    file before it is named, and its folder (and every folder it created) after."""

    def __init__(self, root: str | os.PathLike, *, error: type[StokerError] = StoreError,
                 config: TransferConfig | None = None, staging: str | None = None,
                 unlisted: tuple[str, ...] = ()) -> None:
        raw = os.fspath(root)
        self.root = Path(raw[len("file://"):] if raw.startswith("file://") else raw).expanduser().resolve()
        self.url = str(self.root)
        self.error = error
        self.config = config or TransferConfig.from_env()
        self.staging = self.root / check_object_key(staging, error) if staging else None
        self.unlisted = tuple(unlisted)
        if self.staging is not None:
            try:
                self.staging.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise self.failed("creating", staging, e) from None

    @property
    def local_root(self) -> Path | None:
        return self.root

    def path(self, key: str) -> Path:
        return self.root / check_object_key(key, self.error) if key else self.root

    def failed(self, what: str, key: str, e: OSError) -> StokerError:
        """The error of a failed file operation on ``key``, with the fix."""
        fix = ("free space on its file system or write elsewhere" if e.errno in (errno.ENOSPC, errno.EDQUOT)
               else "check the folder exists, is writable and its disk healthy")
        return self.error(f"{what} {self.path(key)} failed: {e.strerror or e}; {fix}")

    def temp_file(self, prefix: str = "tmp-", near: str = "") -> str:
        """A new empty file for the caller to fill (then :meth:`move_file` it in, or delete it): in the staging
        folder, else beside the object ``near``."""
        folder = self.staging or self.path(near).parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=prefix)
        except OSError as e:
            raise self.failed("creating a temporary file in", os.path.relpath(folder, self.root), e) from None
        os.close(fd)
        return tmp

    @staticmethod
    def _fsync(path: str | os.PathLike) -> None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) if os.path.isdir(path) else os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _made_folders(self, dest: Path) -> list[Path]:
        """Create the folders of ``dest``; return the ones that did not exist, outermost first."""
        missing, folder = [], dest.parent
        while not folder.exists() and folder != self.root.parent:
            missing.append(folder)
            folder = folder.parent
        dest.parent.mkdir(parents=True, exist_ok=True)
        return missing[::-1]

    def _commit(self, key: str, tmp: str, *, durable: bool, readonly: bool, made: list[Path]) -> None:
        """Name the written file ``tmp`` ``key``: fsync it (``durable``), set its mode, rename it. A durable read-only
        object (a blob: a manifest will name it) also has its rename made durable (its folders fsynced); a mutable
        named object (a manifest, a pointer) does not: that costs 3x the file's fsync here, and after a power cut a
        just-renamed object may be missing, never torn."""
        dest = self.path(key)
        if durable:
            self._fsync(tmp)  # the content is on disk before the name points at it
        os.chmod(tmp, 0o444 if readonly else 0o644)  # (mkstemp makes 0600 files; numpy may map read-only ones)
        os.replace(tmp, dest)  # replaces a read-only file too: renaming needs no write access to it
        if durable and readonly:
            self._fsync(dest.parent)
            for folder in made:  # a new folder is named in its parent
                self._fsync(folder.parent)

    def _write(self, key: str, fill: Callable[[str], None], *, durable: bool, readonly: bool) -> None:
        dest = self.path(key)
        try:
            made = self._made_folders(dest)
        except OSError as e:
            raise self.failed("writing", key, e) from None
        tmp = self.temp_file(f".{dest.name}." if self.staging is None else "put-", key)
        try:
            fill(tmp)
            self._commit(key, tmp, durable=durable, readonly=readonly, made=made)
        except OSError as e:
            raise self.failed("writing", key, e) from None
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def put_bytes(self, key: str, data: bytes | memoryview, *, durable: bool = False,
                  readonly: bool = False) -> None:
        self._write(key, lambda tmp: Path(tmp).write_bytes(data), durable=durable, readonly=readonly)

    def put_file(self, key: str, path: str | os.PathLike, *, durable: bool = False,
                 readonly: bool = False) -> None:
        self._write(key, lambda tmp: shutil.copyfile(path, tmp), durable=durable, readonly=readonly)

    def move_file(self, key: str, path: str | os.PathLike, *, durable: bool = False,
                  readonly: bool = False) -> None:
        dest = self.path(key)
        try:
            made = self._made_folders(dest)
            self._commit(key, os.fspath(path), durable=durable, readonly=readonly, made=made)
            return
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise self.failed("writing", key, e) from None
        self.put_file(key, path, durable=durable, readonly=readonly)  # another file system: copy, then remove
        os.unlink(path)

    def try_get_bytes(self, key: str) -> bytes | None:
        try:
            return self.path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def get_range(self, key: str, start: int, length: int) -> bytes:
        try:
            with open(self.path(key), "rb") as f:
                f.seek(start)
                return f.read(length)
        except FileNotFoundError:
            raise self.missing(key) from None

    def _download(self, key: str, dest: str, *, hashed: bool = False, algo: str = SHA256) -> str | None:
        try:
            shutil.copyfile(self.path(key), dest)
            return None
        except FileNotFoundError:
            raise self.missing(key) from None

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        base = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        out = []
        for dirpath, dirnames, filenames in os.walk(base):
            rel = Path(dirpath).relative_to(self.root).as_posix()
            rel = "" if rel == "." else rel + "/"
            # descend only into folders that can hold matching keys, never into the staging folder
            dirnames[:] = sorted(d for d in dirnames if Path(dirpath, d) != self.staging
                                 and not (rel == "" and d in self.unlisted and not prefix.startswith(d + "/"))
                                 and ((rel + d + "/").startswith(prefix) or prefix.startswith(rel + d + "/")))
            for name in filenames:
                if (rel + name).startswith(prefix):
                    st = (Path(dirpath) / name).stat()
                    out.append(ObjectInfo(rel + name, st.st_size, str(st.st_mtime_ns)))
        return sorted(out, key=lambda o: o.key)

    def size(self, key: str) -> int | None:
        try:
            return self.path(key).stat().st_size
        except (FileNotFoundError, NotADirectoryError):
            return None

    def delete(self, key: str) -> None:
        try:
            self.path(key).unlink()
        except FileNotFoundError:
            pass
