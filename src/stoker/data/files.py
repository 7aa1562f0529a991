"""Corpus files: their formats (txt / jsonl / parquet, optionally .gz / .zst), the :class:`Source` interface
and :class:`FileSource`, which reads local files. :mod:`stoker.data.sources` resolves a spec to a source (and
re-exports these names); :mod:`stoker.data.remote` reads object-store files with the same readers.
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
import io
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from stoker.errors import DataError

logger = logging.getLogger(__name__)

TEXT_SUFFIXES = {".txt", ".text", ".md"}
JSONL_SUFFIXES = {".jsonl", ".json", ".ndjson"}
PARQUET_SUFFIXES = {".parquet"}
COMPRESSED = {".gz", ".zst"}
DOC_SPLITS = ("file", "paragraph", "line")


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def file_format(path: Path) -> tuple[str, str | None]:
    """(format, compression) of a file from its suffixes, e.g. ``a.jsonl.zst`` -> ("jsonl", "zst")."""
    suffixes = [s.lower() for s in path.suffixes]
    compression = None
    if suffixes and suffixes[-1] in COMPRESSED:
        compression = suffixes.pop()[1:]
    last = suffixes[-1] if suffixes else ""
    if last in TEXT_SUFFIXES:
        return "text", compression
    if last in JSONL_SUFFIXES:
        return "jsonl", compression
    if last in PARQUET_SUFFIXES and compression is None:
        return "parquet", None
    raise DataError(f"{path}: unsupported file type; use .txt/.md, .jsonl or .parquet files "
                    "(text and jsonl may be compressed as .gz or .zst)")


class _CountedFile(io.FileIO):
    """A file opened for reading that adds every byte read from disk to ``source.bytes_read``."""

    def __init__(self, path: Path, source: Source | None) -> None:
        super().__init__(path, "rb")
        self._source = source

    def _count(self, n: int | None) -> None:
        if n and self._source is not None:
            self._source.bytes_read += n

    def readinto(self, buffer) -> int | None:
        n = super().readinto(buffer)
        self._count(n)
        return n

    def read(self, size: int = -1) -> bytes | None:
        data = super().read(size)
        self._count(len(data) if data else 0)
        return data

    def readall(self) -> bytes:
        data = super().readall()
        self._count(len(data))
        return data


class _GzipFile(gzip.GzipFile):
    """A gzip reader that closes the file it reads when it is closed."""

    def __init__(self, raw: io.RawIOBase) -> None:
        self._buffered = io.BufferedReader(raw)
        super().__init__(fileobj=self._buffered, mode="rb")

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._buffered.close()


def _open_binary(path: Path, compression: str | None, source: Source | None = None):
    raw = _CountedFile(path, source)
    try:
        if compression == "gz":
            return _GzipFile(raw)
        if compression == "zst":
            import zstandard

            return zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)
    except BaseException:
        raw.close()
        raise
    return raw


def check_encoding(encoding: str, errors: str = "strict") -> None:
    """Fail before anything is read or created when ``encoding`` is not a text codec Python knows or
    ``errors`` is not a registered decode-error handler."""
    try:
        info = codecs.lookup(str(encoding))
    except LookupError:
        info = None
    if info is None or not getattr(info, "_is_text_encoding", True):  # e.g. 'base64' is bytes-to-bytes
        raise DataError(f"encoding={encoding!r} (--encoding) is not a text encoding Python knows; pass a codec "
                        "name such as utf-8 (the default), latin-1, cp1252 or utf-16 (see Python's "
                        "'Standard Encodings' list)")
    try:
        codecs.lookup_error(str(errors))
    except LookupError:
        raise DataError(f"errors={errors!r} (--decode-errors) is not a decode-error handler; pass 'strict', "
                        "'replace' or 'ignore'") from None


def _decode(data: bytes, where: str, encoding: str, errors: str) -> str:
    try:
        return data.decode(encoding, errors)
    except UnicodeDecodeError as exc:
        raise DataError(f"{where}: bytes {exc.start}-{exc.end} are not valid {encoding} ({exc.reason}); "
                        "convert the file to UTF-8 (e.g. `iconv -f latin1 -t utf-8`), or pass "
                        "encoding='latin-1' or errors='replace' (--encoding / --decode-errors)") from None


class Source:
    """Base class: ``documents()`` yields the texts; ``describe()`` goes into the manifest.

    File sources count what they have read (``files_done``, ``bytes_read`` on disk) for progress lines."""

    total_docs: int | None = None
    files_done: int = 0
    bytes_read: int = 0

    def documents(self) -> Iterator[str]:
        raise NotImplementedError

    def describe(self) -> dict:
        raise NotImplementedError

    def fingerprint(self) -> str:
        """Changes whenever the documents could have changed."""
        return _digest(self.describe())


class FileSource(Source):
    """Local files. Documents: a whole text file, its blank-line separated paragraphs, or its lines
    (``doc_split``); one JSON object per jsonl line; one parquet row."""

    def __init__(self, spec: str, files: list[Path], *, text_field: str = "text", doc_split: str = "file",
                 encoding: str = "utf-8", errors: str = "strict") -> None:
        if doc_split not in DOC_SPLITS:
            raise DataError(f"doc_split={doc_split!r} is not one of {DOC_SPLITS}; fix --doc-split")
        check_encoding(encoding, errors)
        self.spec, self.files, self.text_field = spec, files, text_field
        self.doc_split, self.encoding, self.errors = doc_split, encoding, errors
        self.formats = [file_format(f) for f in files]  # fails early on an unsupported file

    def describe(self) -> dict:
        stats = []
        for f in self.files:
            st = f.stat()
            stats.append([str(f), st.st_size, st.st_mtime_ns])
        return {"kind": "files", "spec": self.spec, "num_files": len(self.files),
                "bytes": sum(s[1] for s in stats), "files_digest": _digest(stats), "text_field": self.text_field,
                "doc_split": self.doc_split, "encoding": self.encoding, "errors": self.errors}

    def documents(self) -> Iterator[str]:
        for path, (fmt, compression) in zip(self.files, self.formats, strict=True):
            yield from self.read(path, fmt, compression, str(path))

    def read(self, path: Path, fmt: str, compression: str | None, name: str) -> Iterator[str]:
        """The documents of one local file; errors name it ``name`` (its URL when it was downloaded)."""
        if fmt == "text":
            yield from self._text(path, compression, name)
        elif fmt == "jsonl":
            yield from self._jsonl(path, compression, name)
        else:
            yield from self._parquet(path, name)
            try:  # pyarrow reads the file itself: count it whole once it is done
                self.bytes_read += os.path.getsize(path)
            except OSError:
                pass
        self.files_done += 1

    def _text(self, path: Path, compression: str | None, name: str) -> Iterator[str]:
        try:
            with _open_binary(path, compression, self) as f:
                data = f.read()
        except (OSError, EOFError) as exc:
            raise DataError(f"{name}: cannot read ({exc}); check the file is complete") from None
        text = _decode(data, name, self.encoding, self.errors)
        if self.doc_split == "file":
            yield text
        elif self.doc_split == "line":
            yield from (line for line in text.splitlines() if line.strip())
        else:
            yield from (p for p in text.replace("\r\n", "\n").split("\n\n") if p.strip())

    def _jsonl(self, path: Path, compression: str | None, name: str) -> Iterator[str]:
        field = self.text_field
        try:
            with _open_binary(path, compression, self) as raw:
                for lineno, line in enumerate(io.BufferedReader(raw, 1 << 20), 1):
                    if not line.strip():
                        continue
                    where = f"{name}:{lineno}"
                    try:
                        record = json.loads(_decode(line, where, self.encoding, self.errors))
                    except ValueError as exc:
                        raise DataError(f"{where}: not valid JSON ({exc}); each line must be one JSON object") from None
                    if not isinstance(record, dict) or field not in record:
                        keys = sorted(record) if isinstance(record, dict) else type(record).__name__
                        raise DataError(f"{where}: no text field {field!r} (found: {keys}); pass the right "
                                        "field with text_field=... (--text-field)")
                    value = record[field]
                    if not isinstance(value, str):
                        raise DataError(f"{where}: field {field!r} is {type(value).__name__}, not a string; "
                                        "pass a text field with --text-field")
                    yield value
        except (OSError, EOFError) as exc:
            raise DataError(f"{name}: cannot read ({exc}); check the file is complete") from None

    def _parquet(self, path: Path, name: str) -> Iterator[str]:
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(path)
        except Exception as exc:
            raise DataError(f"{name}: not a readable parquet file ({exc}); check the file is complete") from None
        names = pf.schema_arrow.names
        if self.text_field not in names:
            raise DataError(f"{name}: no text column {self.text_field!r} (columns: {names}); pass the right "
                            "column with text_field=... (--text-field)")
        for batch in pf.iter_batches(batch_size=4096, columns=[self.text_field]):
            for value in batch.column(0).to_pylist():
                if value is not None:
                    yield value
