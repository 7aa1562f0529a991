"""Evaluate a committed checkpoint in one process: validation loss / perplexity and greedy samples.

    python -m stoker.train.evaluate CHECKPOINT --data DATASET [--split val] [--batches 8] [--prompt "ROMEO:"]
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from stoker.errors import CheckpointError, DataError
from stoker.train.model import Llama


def load_model(checkpoint: str) -> Llama:
    """The model of a committed checkpoint (any TP/ZeRO-1/FSDP layout) as a plain single-process Llama."""
    from stoker.train.hf import load_checkpoint_weights

    cfg, weights, _ = load_checkpoint_weights(checkpoint)
    model = Llama(cfg)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [k for k in missing if not (cfg.tie_embeddings and k == "output.weight")]
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {checkpoint} does not match its model config: missing {missing[:4]}, "
                              f"unexpected {unexpected[:4]}")
    return model.eval()


@torch.no_grad()
def validation_loss(model: Llama, dataset: Any, batches: int = 8, batch_size: int = 4) -> dict[str, float]:
    """Mean next-token loss over the first `batches` x `batch_size` blocks (deterministic)."""
    n = min(len(dataset), batches * batch_size)
    if n == 0:
        raise DataError("the evaluation split holds no blocks: prepare the data with a larger val_fraction")
    total, count = 0.0, 0
    for start in range(0, n, batch_size):
        idx = list(range(start, min(n, start + batch_size)))
        block = torch.from_numpy(np.stack([np.asarray(dataset[i], dtype=np.int64) for i in idx]))
        block = block[:, : model.cfg.max_seq_len + 1]
        logits = model(block[:, :-1])  # [B, T, V]
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), block[:, 1:].reshape(-1),
                               reduction="sum")
        total += loss.item()
        count += block[:, 1:].numel()
    mean = total / count
    return {"val_loss": mean, "val_perplexity": math.exp(min(mean, 50.0)), "val_tokens": count}


@torch.no_grad()
def greedy(model: Llama, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    ids = list(prompt_ids)
    for _ in range(max_new_tokens):
        x = torch.tensor([ids[-model.cfg.max_seq_len:]])
        ids.append(int(model(x)[0, -1].argmax()))
    return ids[len(prompt_ids):]


def evaluate_checkpoint(checkpoint: str, data: Any, *, split: str = "val", batches: int = 8, batch_size: int = 4,
                        tokenizer: str | None = "llama", prompts: list[str] | None = None,
                        max_new_tokens: int = 24) -> dict[str, Any]:
    """Validation loss/perplexity of `checkpoint` on `data` (a prepared dataset or its URL) and greedy samples."""
    from stoker.data import open_dataset

    torch.manual_seed(0)
    model = load_model(checkpoint)
    out: dict[str, Any] = validation_loss(model, open_dataset(data, split=split), batches, batch_size)
    out["samples"] = []
    if tokenizer and prompts:
        from stoker.data import load_tokenizer

        tok = load_tokenizer(tokenizer)
        for p in prompts:
            ids = ([tok.bos_id] if tok.bos_id is not None else []) + tok.encode(p)
            out["samples"].append({"prompt": p, "completion": tok.decode(greedy(model, ids, max_new_tokens))})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stoker.train.evaluate", description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--data", required=True)
    ap.add_argument("--split", default="val")
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--tokenizer", default="llama")
    ap.add_argument("--prompt", action="append", default=[])
    ap.add_argument("--max-new-tokens", type=int, default=24)
    a = ap.parse_args(argv)
    print(json.dumps(evaluate_checkpoint(a.checkpoint, a.data, split=a.split, batches=a.batches,
                                         tokenizer=a.tokenizer, prompts=a.prompt, max_new_tokens=a.max_new_tokens),
                     indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
