"""Packing: one token stream per split, cut into ``block_size`` blocks across document boundaries, written
as flat shards of whole blocks with a running sha256. Only the stream's final partial block is dropped
(or padded, ``remainder="pad"``) -- never a remainder per batch of documents.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

REMAINDERS = ("drop", "pad")


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.uint32)


class SplitWriter:
    """Writes one split's token stream into ``<root>/<split>/shard-NNNNN.bin`` files of whole blocks."""

    def __init__(self, root: Path, split: str, *, dtype: np.dtype, block_size: int, shard_blocks: int,
                 remainder: str = "drop", pad_id: int = 0) -> None:
        self.root, self.split, self.dtype = root, split, np.dtype(dtype)
        self.block_size, self.shard_tokens = block_size, shard_blocks * block_size
        self.remainder, self.pad_id = remainder, pad_id
        self.pending = np.empty(0, dtype=self.dtype)  # < block_size tokens not yet in a whole block
        self.shards: list[dict] = []
        self.num_documents = 0
        self._file = None
        self._hash = None
        self._in_shard = 0
        self.dropped_tokens = 0
        self.padded_tokens = 0

    def add(self, tokens: np.ndarray, num_documents: int = 0) -> None:
        """Append tokens (already holding BOS/EOS) to the stream."""
        self.num_documents += num_documents
        data = np.concatenate([self.pending, tokens.astype(self.dtype, copy=False)]) if len(self.pending) else \
            tokens.astype(self.dtype, copy=False)
        whole = len(data) - len(data) % self.block_size
        self._write(data[:whole])
        self.pending = data[whole:].copy()

    def _write(self, data: np.ndarray) -> None:
        while len(data):
            if self._file is None:
                self._open()
            take = min(len(data), self.shard_tokens - self._in_shard)
            self._emit(np.ascontiguousarray(data[:take]))
            self._in_shard += take
            data = data[take:]
            if self._in_shard == self.shard_tokens:
                self._close_shard()

    def _emit(self, chunk: np.ndarray) -> None:
        """Write whole blocks into the open shard (the Hugging Face writer writes arrow rows instead)."""
        self._file.write(memoryview(chunk).cast("B"))
        self._hash.update(memoryview(chunk).cast("B"))

    def _open(self) -> None:
        rel = f"{self.split}/shard-{len(self.shards):05d}.bin"
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "wb")
        self._hash = hashlib.sha256()
        self._in_shard = 0
        self._rel = rel

    def _close_shard(self) -> None:
        self._file.close()
        self.shards.append({"path": self._rel, "num_tokens": self._in_shard,
                            "num_blocks": self._in_shard // self.block_size,
                            "bytes": self._in_shard * self.dtype.itemsize, "sha256": self._hash.hexdigest()})
        self._file = None

    def close(self) -> dict:
        """Finish the stream (drop or pad the last partial block) and return the split's manifest entry."""
        if len(self.pending):
            if self.remainder == "pad":
                pad = self.block_size - len(self.pending)
                self.padded_tokens = pad
                self._write(np.concatenate([self.pending, np.full(pad, self.pad_id, dtype=self.dtype)]))
            else:
                self.dropped_tokens = len(self.pending)
            self.pending = self.pending[:0]
        if self._file is not None:
            self._close_shard()
        num_tokens = sum(s["num_tokens"] for s in self.shards)
        return {"num_documents": self.num_documents, "num_tokens": num_tokens,
                "num_blocks": num_tokens // self.block_size, "dropped_tokens": self.dropped_tokens,
                "padded_tokens": self.padded_tokens, "shards": self.shards}

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def is_val_document(index: int, val_fraction: float) -> bool:
    """Whether document ``index`` goes to validation: evenly spread, round(n * fraction) of n documents."""
    if val_fraction <= 0:
        return False
    return int((index + 1) * val_fraction + 0.5) > int(index * val_fraction + 0.5)
