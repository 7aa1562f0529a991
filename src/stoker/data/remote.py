"""Corpus files in an object store: ``s3://bucket/prefix/`` (every supported file under it), a glob
(``s3://bucket/raw/**/*.jsonl.gz``) or one object; other fsspec URLs (``gs://``, ``memory://`` ...) work
when their driver is installed.

Objects are listed once (their sizes and ETags enter the cache fingerprint, so a changed object means a
new dataset), then downloaded one ahead of the one being tokenized into a temporary folder and read by
the same readers as local files; each is deleted once read. S3 goes through boto3 and honours
``$STOKER_S3_ENDPOINT_URL`` like the rest of stoker.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath

from stoker.data import layout
from stoker.data.sources import FileSource, _digest, file_format
from stoker.errors import DataError

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


def _listing(fs, prefix: str, spec: str, whole: bool) -> list[tuple[str, int, str]]:
    """(path, size, version) of every object whose path starts with ``prefix`` (``whole``: the prefix is a
    whole folder or object name, not the start of a glob)."""
    if isinstance(fs, layout.S3Files):
        return fs.listing(prefix)
    folder = prefix if whole or prefix.endswith("/") or "/" not in prefix else prefix.rsplit("/", 1)[0]
    try:
        found = fs.find(folder, detail=True)  # fsspec lists folders, not key prefixes
        if not found and fs.isfile(prefix):
            found = {prefix: fs.info(prefix)}
    except FileNotFoundError:
        return []
    except Exception as exc:  # the driver's own errors (permissions, network)
        raise DataError(f"{spec}: listing failed ({type(exc).__name__}: {exc}); check the URL and your "
                        "credentials for it") from None
    return sorted((p, int(info.get("size") or 0), str(info.get("ETag") or info.get("mtime") or
                                                        info.get("created") or ""))
                  for p, info in found.items() if p.startswith(prefix))


class RemoteFileSource(FileSource):
    """Files in an object store, read like local files after a download (see the module docstring)."""

    def __init__(self, spec: str, fs, protocol: str, objects: list[tuple[str, int, str]], **options) -> None:
        self.fs, self.protocol, self.objects = fs, protocol, objects
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
                return pool.submit(self.fs.get_file, self.objects[i][0], str(local)), local

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
    protocol = spec.split("://", 1)[0]
    fs, path = layout.filesystem(spec)
    cut = min((path.index(c) for c in _GLOB_CHARS if c in path), default=None)
    objects = _listing(fs, path if cut is None else path[:cut], spec, whole=cut is None)
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
    return RemoteFileSource(spec, fs, protocol, objects, **options)


def _supported(relative: str) -> bool:
    """A corpus file type, not inside a dot-folder (or a dot-file) below the folder that was named."""
    try:
        file_format(PurePosixPath(relative))
    except DataError:
        return False
    return not any(part.startswith(".") for part in PurePosixPath(relative).parts)
