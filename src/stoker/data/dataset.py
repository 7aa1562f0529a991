"""``open_dataset``: a memory-mapped, checksum-verified view of one split of a prepared dataset."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import numpy as np

from stoker._hashing import sha256_file
from stoker.data import layout
from stoker.data.layout import DatasetRef
from stoker.errors import DataError

logger = logging.getLogger(__name__)
VERIFY = ("full", "lazy", "none")


class PackedDataset:
    """One split: ``len(ds)`` blocks, ``ds[i]`` the i-th block as an array of ``block_size`` token ids."""

    def __init__(self, root: Path, manifest: dict, split: str = "train", verify: str = "lazy") -> None:
        if verify not in VERIFY:
            raise DataError(f"verify={verify!r} must be one of {VERIFY}")
        layout.check_manifest(manifest, str(root / layout.MANIFEST))  # no shard path may leave ``root``
        if split not in manifest["splits"]:
            raise DataError(f"{root} has no {split!r} split (it has {sorted(manifest['splits'])}); prepare it with "
                            "a val_fraction large enough for a validation split (--val-fraction)")
        self.root, self.manifest, self.split = root, manifest, split
        self.block_size = int(manifest["block_size"])
        self.vocab_size = int(manifest["tokenizer"]["vocab_size"])
        self.dtype = np.dtype(manifest["dtype"])
        self.shards = manifest["splits"][split]["shards"]
        self._verified = [False] * len(self.shards)
        self._lock = threading.Lock()
        for shard in self.shards:
            path = root / shard["path"]
            if not path.is_file():
                raise DataError(f"{path} is missing from the dataset; prepare it again with overwrite=True "
                                "(--overwrite)")
            if path.stat().st_size != shard["bytes"]:
                raise DataError(f"{path} has {path.stat().st_size} bytes, the manifest says {shard['bytes']}: the "
                                "dataset is corrupted; prepare it again with overwrite=True (--overwrite)")
        self._maps = [np.memmap(root / s["path"], dtype=self.dtype, mode="r", shape=(s["num_blocks"], self.block_size))
                      for s in self.shards]
        self._ends = np.cumsum([s["num_blocks"] for s in self.shards])
        if verify == "full":
            for i in range(len(self.shards)):
                self._verify(i)
        elif verify == "none":
            self._verified = [True] * len(self.shards)

    def _verify(self, index: int) -> None:
        with self._lock:
            if self._verified[index]:
                return
            shard = self.shards[index]
            path = self.root / shard["path"]
            digest = sha256_file(path)
            if digest != shard["sha256"]:
                raise DataError(f"{path}: checksum mismatch (sha256 {digest[:12]}..., manifest {shard['sha256'][:12]}"
                                "...): the shard is corrupted; prepare the dataset again with overwrite=True "
                                "(--overwrite)")
            self._verified[index] = True

    def verify(self) -> None:
        """Check every shard's sha256 now (raises DataError on a mismatch)."""
        for i in range(len(self.shards)):
            self._verify(i)

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def _locate(self, index: int) -> tuple[int, int]:
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"block {index} out of range for {len(self)} blocks")
        shard = int(np.searchsorted(self._ends, index, side="right"))
        start = int(self._ends[shard - 1]) if shard else 0
        if not self._verified[shard]:
            self._verify(shard)
        return shard, index - start

    def __getitem__(self, index: int) -> np.ndarray:
        shard, row = self._locate(int(index))
        return np.asarray(self._maps[shard][row])

    def get_batch(self, indices) -> np.ndarray:
        """Blocks ``indices`` as one int64 array ``[len(indices), block_size]``."""
        out = np.empty((len(indices), self.block_size), dtype=np.int64)
        for k, index in enumerate(indices):
            shard, row = self._locate(int(index))
            out[k] = self._maps[shard][row]
        return out

    def __repr__(self) -> str:
        return (f"PackedDataset({str(self.root)!r}, split={self.split!r}, blocks={len(self)}, "
                f"block_size={self.block_size})")


def open_dataset(ref_or_url: DatasetRef | str | os.PathLike, split: str = "train",
                 verify: str = "lazy") -> PackedDataset:
    """Open one split of a prepared dataset (a :class:`DatasetRef`, a folder, or an fsspec URL).

    Remote datasets are downloaded once into ``$STOKER_HOME/cache/datasets/<fingerprint>``. ``verify``:
    ``"lazy"`` (default) checks a shard's sha256 the first time one of its blocks is read, ``"full"``
    checks all shards now, ``"none"`` only checks sizes.
    """
    url = ref_or_url.url if isinstance(ref_or_url, DatasetRef) else str(ref_or_url)
    manifest = layout.read_manifest(url)
    if manifest is None:
        raise DataError(f"{url} holds no {layout.MANIFEST}: it is not a prepared dataset (or its prepare did not "
                        "finish); run `stoker data prepare` first")
    if manifest["format"] == layout.HF_FORMAT:
        raise DataError(f"{url} was prepared with --format hf (a Hugging Face save_to_disk folder); read it with "
                        "datasets.load_from_disk or stoker.data.hf_export.load_hf_dataset, or prepare it again "
                        "without --format hf for open_dataset")
    if layout.is_remote(url):
        root = layout.home_dir() / "cache" / "datasets" / manifest["fingerprint"]
        if not (root / layout.MANIFEST).is_file():
            root.parent.mkdir(parents=True, exist_ok=True)
            logger.info("downloading %s to %s", url, root)
            layout.download(url, manifest, root)
    else:
        root = layout.local_path(url)
    return PackedDataset(root, manifest, split=split, verify=verify)
