"""Training data: a prepared ``stoker.data`` dataset, or a flat token file for quick experiments.

Both give a dataset with ``len``, ``get_batch(indices) -> int64 [n, block_size]``, ``block_size`` and
``vocab_size`` (None for token files), read through ``stoker.data.BlockLoader`` (deterministic,
data-parallel, resumable). Each block holds the inputs and, shifted by one, the targets: a model trains
on ``block_size - 1`` positions.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from stoker.errors import DataError

log = logging.getLogger(__name__)

TOKEN_FILE_SUFFIXES = (".bin", ".npy")


class TokenFileDataset:
    """A flat file of token ids (raw ``.bin`` of ``dtype`` or ``.npy``) cut into ``block_size`` blocks."""

    vocab_size: int | None = None

    def __init__(self, path: str | Path, block_size: int, dtype: str = "uint16") -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise DataError(f"token file {self.path} does not exist; set data.url to an existing .bin/.npy file "
                            "or to a dataset prepared with `stoker data prepare`")
        if self.path.suffix == ".npy":
            self.tokens = np.load(self.path, mmap_mode="r")
        else:
            try:
                self.tokens = np.memmap(self.path, dtype=np.dtype(dtype), mode="r")
            except ValueError as e:
                raise DataError(f"cannot read {self.path} as {dtype} tokens: {e}; check data.token_dtype") from None
        if block_size < 2:
            raise DataError(f"block size {block_size} is too small: a block holds inputs and shifted targets")
        self.block_size = block_size
        self.num_blocks = len(self.tokens) // block_size
        if self.num_blocks == 0:
            raise DataError(f"{self.path} holds {len(self.tokens)} tokens, fewer than one block of {block_size}; "
                            "use a larger file or a smaller data.block_size")

    def __len__(self) -> int:
        return self.num_blocks

    def __getitem__(self, index: int) -> np.ndarray:
        start = int(index) * self.block_size
        return np.asarray(self.tokens[start : start + self.block_size], dtype=np.int64)

    def get_batch(self, indices: Any) -> np.ndarray:
        return np.stack([self[i] for i in indices])


def _local_path(url: str) -> Path | None:
    if url.startswith("file://"):
        return Path(url[len("file://"):])
    return None if "://" in url else Path(url)


def open_training_data(url: str, *, split: str, block_size: int, token_dtype: str) -> Any:
    """Open ``url`` (token file or prepared dataset); raise DataError with the fix when it is missing."""
    if not url:
        raise DataError("data.url is not set: pass --data <prepared dataset or token file> "
                        "(prepare one with `stoker data prepare`)")
    path = _local_path(url)
    if path is not None and path.suffix in TOKEN_FILE_SUFFIXES:
        return TokenFileDataset(path, block_size, token_dtype)
    if path is not None and not path.exists():
        raise DataError(f"data.url {url}: no such file or folder; prepare the dataset with `stoker data prepare` "
                        f"or point data.url at a {'/'.join(TOKEN_FILE_SUFFIXES)} token file")
    from stoker.data import open_dataset

    return open_dataset(url, split=split)


def make_loader(dataset: Any, *, batch_size: int, dp_rank: int, dp_size: int, seed: int, shuffle: bool,
                global_batch: int | None = None) -> Any:
    """``stoker.data.BlockLoader`` over ``dataset`` (epochs end on a ``global_batch`` boundary)."""
    from stoker.data import BlockLoader

    return BlockLoader(dataset, batch_size, dp_rank=dp_rank, dp_size=dp_size, seed=seed, shuffle=shuffle,
                       global_batch=global_batch)
