"""``--format hf``: the packed blocks as a Hugging Face ``save_to_disk`` folder, the input of NeuronX
Distributed's Llama pre-training example (``datasets.load_from_disk(data_dir)``).

The columns are exactly those NxD's own ``examples/training/llama/get_dataset.py`` writes (tokenizer output
``input_ids`` + ``attention_mask``, ``group_texts`` adds ``labels = input_ids``), with the dtypes
``datasets`` records for them: ``input_ids`` int32 and ``attention_mask`` int8 (``datasets``' optimized
types for these names), ``labels`` int64 (inferred from Python ints); every row ``block_size`` long. The
training script's ``default_data_collator`` reads the same three columns.

Files are written as ``datasets`` <= 3.6 writes them (the range NxD's requirements pin): features
serialized as ``Sequence`` (``datasets`` >= 4 writes ``List``, which 3.x cannot read, and still reads
``Sequence``). Layout (the output folder is the train split itself, so ``--data_dir`` points at it)::

    dataset_info.json, state.json, data-00000-of-0000N.arrow ...   the train split (arrow IPC streams)
    val/dataset_info.json, val/state.json, val/data-*.arrow        the validation split, when there is one
    manifest.json                                                   stoker's: fingerprint, every file's sha256

Shards are written block by block as the stream is packed (never the whole corpus in memory), by the
same :class:`~stoker.data.pack.SplitWriter` packing as stoker's own shards, so the rows equal its blocks.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from stoker._hashing import sha256_file
from stoker.data import layout
from stoker.data.layout import DatasetRef
from stoker.data.pack import SplitWriter
from stoker.errors import DataError

#: column -> dtype, in NxD's order (get_dataset.py: tokenizer(...) then group_texts' labels)
COLUMNS = {"input_ids": "int32", "attention_mask": "int8", "labels": "int64"}
#: arrow bytes per token (values only), to size shards like ``shard_mb``
BYTES_PER_TOKEN = 4 + 1 + 8
ROWS_PER_BATCH = 1000  # datasets' ArrowWriter default writer_batch_size
IGNORE_INDEX = -100  # labels of padding (--remainder pad): what Hugging Face losses skip


def features() -> dict:
    """The ``features`` of dataset_info.json and of the arrow schema metadata, as datasets 3.x writes them."""
    return {name: {"feature": {"dtype": dtype, "_type": "Value"}, "_type": "Sequence"}
            for name, dtype in COLUMNS.items()}


def arrow_schema():
    import pyarrow as pa

    meta = {"huggingface": json.dumps({"info": {"features": features()}})}
    return pa.schema([pa.field(name, pa.list_(pa.from_numpy_dtype(np.dtype(dtype))))
                      for name, dtype in COLUMNS.items()], metadata=meta)


def split_folder(root: Path, split: str) -> Path:
    """The train split is the output folder itself (what NxD's --data_dir names); others a sub-folder."""
    return root if split == "train" else root / split


class ArrowSplitWriter(SplitWriter):
    """A :class:`SplitWriter` whose shards are ``data-NNNNN-of-MMMMM.arrow`` files of rows of ``block_size``
    ids, each written as record batches while the stream is packed; ``close`` names the shards and writes
    state.json and dataset_info.json."""

    def __init__(self, root: Path, split: str, *, fingerprint: str, **kwargs) -> None:
        super().__init__(root, split, **kwargs)
        self.folder, self.fingerprint = split_folder(root, split), fingerprint
        self._schema = arrow_schema()
        self._pad_from: int | None = None  # during close(remainder="pad"): where the last block's padding starts

    def _open(self) -> None:
        import pyarrow as pa

        self.folder.mkdir(parents=True, exist_ok=True)
        self._path = self.folder / f".data-{len(self.shards):05d}.arrow.part"
        self._file = pa.ipc.new_stream(str(self._path), self._schema)
        self._in_shard = 0

    def _emit(self, chunk: np.ndarray) -> None:
        import pyarrow as pa

        bs = self.block_size
        for start in range(0, len(chunk), ROWS_PER_BATCH * bs):
            part = chunk[start:start + ROWS_PER_BATCH * bs]
            rows = len(part) // bs
            offsets = pa.array(np.arange(rows + 1, dtype=np.int32) * bs)
            ids = part.astype(np.int32)
            mask = np.ones(len(part), dtype=np.int8)
            labels = ids.astype(np.int64)
            if self._pad_from is not None and start + len(part) == len(chunk):  # the padded last block
                mask[len(part) - bs + self._pad_from:] = 0
                labels[len(part) - bs + self._pad_from:] = IGNORE_INDEX
            cols = [pa.ListArray.from_arrays(offsets, pa.array(values)) for values in (ids, mask, labels)]
            self._file.write_batch(pa.record_batch(cols, schema=self._schema))

    def _close_shard(self) -> None:
        self._file.close()
        self._file = None
        self.shards.append({"path": self._path.name, "num_tokens": self._in_shard,
                            "num_blocks": self._in_shard // self.block_size, "bytes": self._path.stat().st_size,
                            "sha256": sha256_file(self._path)})

    def close(self) -> dict:
        if len(self.pending) and self.remainder == "pad":
            self._pad_from = len(self.pending)
        entry = super().close()
        n = len(self.shards)
        prefix = "" if self.folder == self.root else f"{self.folder.relative_to(self.root).as_posix()}/"
        for i, shard in enumerate(self.shards):
            name = f"data-{i:05d}-of-{n:05d}.arrow"
            os.replace(self.folder / shard["path"], self.folder / name)
            shard["path"] = prefix + name
        if n:
            write_metadata(self.folder, [s["path"][len(prefix):] for s in self.shards], self.split,
                           self.fingerprint)
        return entry

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def write_metadata(folder: Path, data_files: list[str], split: str, fingerprint: str) -> None:
    """state.json and dataset_info.json as ``Dataset.save_to_disk`` (datasets <= 3.6) writes them."""
    state = {"_data_files": [{"filename": name} for name in data_files],
             "_fingerprint": hashlib.sha256(f"{fingerprint}/{split}".encode()).hexdigest()[:16],
             "_format_columns": None, "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False,
             "_split": split}
    (folder / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True))
    info = {"citation": "", "description": "", "features": features(), "homepage": "", "license": ""}
    (folder / "dataset_info.json").write_text(json.dumps(info, indent=2))


def file_list(staging: Path) -> list[dict]:
    """Every file of the prepared folder but the manifest, with its size and sha256 (what a download checks)."""
    return [{"path": f.relative_to(staging).as_posix(), "bytes": f.stat().st_size, "sha256": sha256_file(f)}
            for f in sorted(staging.rglob("*")) if f.is_file() and f.name != layout.MANIFEST]


def hf_dataset_path(ref_or_url: DatasetRef | str | os.PathLike, split: str = "train") -> Path:
    """The local ``save_to_disk`` folder of one split of a ``--format hf`` dataset, for
    ``datasets.load_from_disk`` (or NxD's ``--data_dir``). A remote one (``s3://...``) is downloaded once
    into ``$STOKER_HOME/cache/datasets/<fingerprint>``, every file checked against its recorded sha256."""
    url = ref_or_url.url if isinstance(ref_or_url, DatasetRef) else str(ref_or_url)
    manifest = layout.read_manifest(url)
    if manifest is None:
        raise DataError(f"{url} holds no {layout.MANIFEST}: it is not a prepared dataset (or its prepare did not "
                        "finish); run `stoker data prepare --format hf` first")
    if manifest["format"] != layout.HF_FORMAT:
        raise DataError(f"{url} is a stoker-format dataset, not a Hugging Face one; open it with open_dataset(), "
                        "or prepare it again with format='hf' (--format hf)")
    if split not in manifest["splits"]:
        raise DataError(f"{url} has no {split!r} split (it has {sorted(manifest['splits'])}); prepare it with a "
                        "val_fraction large enough for a validation split (--val-fraction)")
    if layout.is_remote(url):
        root = layout.home_dir() / "cache" / "datasets" / manifest["fingerprint"]
        if not (root / layout.MANIFEST).is_file():
            root.parent.mkdir(parents=True, exist_ok=True)
            layout.download(url, manifest, root)
    else:
        root = layout.local_path(url)
    return split_folder(root, split)


def load_hf_dataset(ref_or_url: DatasetRef | str | os.PathLike, split: str = "train"):
    """``datasets.load_from_disk`` of one split of a ``--format hf`` dataset (downloaded first when remote)."""
    import datasets

    return datasets.load_from_disk(str(hf_dataset_path(ref_or_url, split)))
