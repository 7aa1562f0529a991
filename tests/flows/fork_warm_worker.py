"""A rank of tests/flows/fork_warm_flow.py: torch's intra-op pool and a 64 MB BLAKE3 hash, then it says so."""

import os

import torch

from stoker._hashing import BLAKE3, content_key

a = torch.rand(600, 600)
total = float((a @ a).sum())
key = content_key(os.urandom(64 << 20), BLAKE3)
print(f"fork_warm_worker: rank {os.environ.get('RANK')} pid {os.getpid()} matmul {total:.1f} hash {key[:12]}",
      flush=True)
