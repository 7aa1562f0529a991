"""Content hashing shared by every layer (blobs, dataset shards, tokenizer fingerprints)."""

from __future__ import annotations

import hashlib
import os

CHUNK = 8 << 20


def sha256_file(path: str | os.PathLike, chunk: int = CHUNK) -> str:
    """The sha256 hex digest of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for data in iter(lambda: f.read(chunk), b""):
            h.update(data)
    return h.hexdigest()
