"""Corpus files in an object store: ``s3://bucket/prefix/`` (every supported file under it), a glob
(``s3://bucket/raw/**/*.jsonl.gz``) or one object; other fsspec URLs (``gs://``, ``memory://`` ...) work
when their driver is installed.

Objects are listed once (their sizes and ETags enter the cache fingerprint, so a changed object means a
new dataset), then downloaded one ahead of the one being tokenized into a temporary folder and read by
the same readers as local files; each is deleted once read. Every URL goes through
:mod:`stoker.store.objects` (S3 through boto3, honouring ``$STOKER_S3_ENDPOINT_URL`` like the rest of stoker).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath

from stoker.data import layout
from stoker.data.files import FileSource, _digest, file_format
from stoker.errors import DataError
from stoker.store.objects import ObjectStore

_GLOB_CHARS = "*?["


def glob_match(pattern: str, path: str) -> bool:
    """Shell-glob matching of ``/``-separated paths: ``**`` spans any number of folders, ``*``, ``?`` and
    ``[...]`` stay within one name (``fnmatch`` per name), and wildcards skip names starting with a dot
    unless the pattern's name does (as ``glob`` does)."""
    return _match(pattern.split("/"), path.split("/"))


def _match(pattern: list[str], parts: list[str]) -> bool:
    if not pattern:
        return not parts
    head = pattern[0]
    if head == "**":
        for i in range(len(parts) + 1):
            if _match(pattern[1:], parts[i:]):
                return True
            if i < len(parts) and parts[i].startswith("."):
                return False
        return False
    if not parts or (parts[0].startswith(".") and not head.startswith(".")):
        return False
    return fnmatchcase(parts[0], head) and _match(pattern[1:], parts[1:])


def _listing(store: ObjectStore, base: str, prefix: str) -> list[tuple[str, int, str]]:
    """(path, size, version) of every object whose key starts with ``prefix``; a path is ``base/key`` (the
    bucket, or the fsspec root, and the key), as it is named in messages and in the dataset's fingerprint."""
    return [(f"{base}/{o.key}", o.size, o.etag) for o in store.list(prefix)]


class RemoteFileSource(FileSource):
    """Files in an object store, read like local files after a download (see the module docstring)."""

    def __init__(self, spec: str, store: ObjectStore, protocol: str, objects: list[tuple[str, int, str]],
                 **options) -> None:
        self.store, self.protocol, self.objects = store, protocol, objects
        self._base = store.url.split("://", 1)[1]
        super().__init__(spec, [PurePosixPath(p) for p, _, _ in objects], **options)

    def url(self, path: str) -> str:
        return f"{self.protocol}://{path}"

    def describe(self) -> dict:
        return {"kind": "remote-files", "spec": self.spec, "num_files": len(self.objects),
                "bytes": sum(size for _, size, _ in self.objects), "files_digest": _digest(self.objects),
                "text_field": self.text_field, "doc_split": self.doc_split, "encoding": self.encoding,
                "errors": self.errors}

    def documents(self) -> Iterator[str]:
        with tempfile.TemporaryDirectory(prefix="stoker-source-") as tmp, ThreadPoolExecutor(1) as pool:

            def fetch(i: int):
                local = Path(tmp) / f"{i:06d}-{PurePosixPath(self.objects[i][0]).name}"
                key = self.objects[i][0][len(self._base) + 1:]
                return pool.submit(self.store.get_file, key, str(local)), local

            pending = fetch(0) if self.objects else None
            try:
                for i, (fmt, compression) in enumerate(self.formats):
                    future, local = pending
                    self._downloaded(future, i)
                    pending = fetch(i + 1) if i + 1 < len(self.objects) else None  # the next one meanwhile
                    yield from self.read(local, fmt, compression, self.url(self.objects[i][0]))
                    local.unlink(missing_ok=True)
            finally:
                if pending is not None:
                    pending[0].cancel()  # stopped early: no need to fetch a file nobody will read

    def _downloaded(self, future, i: int) -> None:
        try:
            future.result()
        except DataError:
            raise
        except Exception as exc:  # fsspec drivers raise their own errors
            raise DataError(f"{self.url(self.objects[i][0])}: download failed ({exc}); check it still exists "
                            "and you can read it") from None


def remote_source(spec: str, **options) -> RemoteFileSource:
    """The files a remote URL names: every supported file under a prefix, a glob's matches, or one object."""
    protocol, _, rest = spec.partition("://")
    base = rest.split("/", 1)[0]  # the bucket (or the first folder of an fsspec URL)
    store = layout.objects(f"{protocol}://{base}")
    path = f"{base}/{rest.split('/', 1)[1]}".rstrip("/") if "/" in rest else base
    cut = min((path.index(c) for c in _GLOB_CHARS if c in path), default=None)
    head = path if cut is None else path[:cut]
    objects = _listing(store, base, head[len(base) + 1:])
    exact = [o for o in objects if o[0] == path]  # one object (even one whose name holds glob characters)
    if exact:
        objects = exact
    elif cut is not None:
        objects = [o for o in objects if glob_match(path, o[0])]
    else:  # a "folder": the corpus files under it (not in dot-folders below it)
        objects = [o for o in objects if o[0].startswith(path + "/") and _supported(o[0][len(path) + 1:])]
    if not objects:
        raise DataError(f"source {spec!r} matches no objects; check the bucket and prefix (a folder prefix, a "
                        "glob like s3://bucket/raw/*.jsonl.gz, or one object) and STOKER_S3_ENDPOINT_URL")
    return RemoteFileSource(spec, store, protocol, objects, **options)


def _supported(relative: str) -> bool:
    """A corpus file type, not inside a dot-folder (or a dot-file) below the folder that was named."""
    try:
        file_format(PurePosixPath(relative))
    except DataError:
        return False
    return not any(part.startswith(".") for part in PurePosixPath(relative).parts)
