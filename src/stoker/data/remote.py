"""Corpus files in an object store: ``s3://bucket/prefix/`` (every supported file under it), a glob
(``s3://bucket/raw/**/*.jsonl.gz``) or one object; other fsspec URLs (``gs://``, ``memory://`` ...) work
when their driver is installed.

Objects are listed once (their sizes and ETags enter the cache fingerprint, so a changed object means a
new dataset), then downloaded one ahead of the one being tokenized into a temporary folder and read by
the same readers as local files; each is deleted once read. S3 goes through boto3 and honours
``$STOKER_S3_ENDPOINT_URL`` like the rest of stoker.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath

from stoker.data import layout
from stoker.data.sources import FileSource, _digest, file_format
from stoker.errors import DataError

_GLOB_CHARS = "*?["


def _glob_regex(pattern: str) -> re.Pattern:
    """``**`` crosses folders, ``*`` and ``?`` stay within one, ``[...]`` as in shell globs."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 1:]:
            end = pattern.index("]", i + 1)
            out.append("[" + pattern[i + 1:end].replace("!", "^", 1) + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def _listing(fs, prefix: str) -> list[tuple[str, int, str]]:
    """(path, size, version) of every object under ``prefix``."""
    if isinstance(fs, layout.S3Files):
        return fs.listing(prefix)
    folder = prefix if prefix.endswith("/") or "/" not in prefix else prefix.rsplit("/", 1)[0]
    try:
        found = fs.find(folder, detail=True)  # fsspec lists folders, not key prefixes
    except FileNotFoundError:
        return []
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
            for i, (fmt, compression) in enumerate(self.formats):
                future, local = pending
                try:
                    future.result()
                except DataError:
                    raise
                except Exception as exc:  # fsspec drivers raise their own errors
                    raise DataError(f"{self.url(self.objects[i][0])}: download failed ({exc}); check it still "
                                    "exists and you can read it") from None
                pending = fetch(i + 1) if i + 1 < len(self.objects) else None
                yield from self.read(local, fmt, compression, self.url(self.objects[i][0]))
                local.unlink(missing_ok=True)


def remote_source(spec: str, **options) -> RemoteFileSource:
    """The files a remote URL names: every supported file under a prefix, a glob's matches, or one object."""
    protocol = spec.split("://", 1)[0]
    fs, path = layout.filesystem(spec)
    cut = min((path.index(c) for c in _GLOB_CHARS if c in path), default=None)
    prefix = path if cut is None else path[:cut]
    objects = _listing(fs, prefix)
    if cut is not None:
        match = _glob_regex(path).match
        objects = [o for o in objects if match(o[0])]
    else:
        objects = [o for o in objects if o[0] == path or o[0].startswith(path + "/")]
        if len(objects) > 1 or (objects and objects[0][0] != path):  # a "folder": keep the corpus files in it
            objects = [o for o in objects if _supported(o[0])]
    if not objects:
        raise DataError(f"source {spec!r} matches no objects; check the bucket and prefix (a folder prefix, a "
                        "glob like s3://bucket/raw/*.jsonl.gz, or one object) and STOKER_S3_ENDPOINT_URL")
    return RemoteFileSource(spec, fs, protocol, objects, **options)


def _supported(path: str) -> bool:
    try:
        file_format(PurePosixPath(path))
    except DataError:
        return False
    return not any(part.startswith(".") for part in PurePosixPath(path).parts)
