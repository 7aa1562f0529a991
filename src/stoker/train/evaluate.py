"""Evaluate a committed checkpoint in one process: validation loss / perplexity and samples (greedy, or
temperature / top-k sampling from a seeded generator, so samples are reproducible).

    python -m stoker.train.evaluate CHECKPOINT --data DATASET [--split val] [--batches 8] [--prompt "ROMEO:"]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from stoker.errors import CheckpointError, ConfigError, DataError, StokerError
from stoker.train.model import Llama


def load_model(checkpoint: str) -> Llama:
    """The model of a committed checkpoint (any TP/ZeRO-1/FSDP layout) as a plain single-process Llama.
    ``checkpoint``: a step folder (refused in one line when damaged) or a checkpoint directory (its newest
    valid checkpoint)."""
    from stoker.train.hf import load_checkpoint_weights

    cfg, weights, _ = load_checkpoint_weights(checkpoint, what="evaluate")
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
    if batches < 1 or batch_size < 1:
        raise ConfigError(f"evaluate: batches={batches} and batch_size={batch_size}: both must be at least 1 (the "
                          "loss is the mean over batches x batch_size blocks)")
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
def generate(model: Llama, prompt_ids: list[int], max_new_tokens: int, *, temperature: float = 0.0, top_k: int = 0,
             generator: torch.Generator | None = None) -> list[int]:
    """New token ids after ``prompt_ids``: greedy when ``temperature`` is 0, else sampled from the softmax at
    that temperature over the ``top_k`` most likely tokens (all when 0)."""
    ids = list(prompt_ids)
    for _ in range(max_new_tokens):
        logits = model(torch.tensor([ids[-model.cfg.max_seq_len:]]))[0, -1].float()  # [V]
        if temperature <= 0:
            ids.append(int(logits.argmax()))
            continue
        if 0 < top_k < logits.numel():
            kth = torch.topk(logits, top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits / temperature, dim=-1)
        ids.append(int(torch.multinomial(probs, 1, generator=generator)))
    return ids[len(prompt_ids):]


def check_settings(*, batches: int, batch_size: int, max_new_tokens: int, temperature: float, top_k: int) -> None:
    """A ConfigError naming the first setting out of its range."""
    for name, value, low in (("batches", batches, 1), ("batch_size", batch_size, 1),
                             ("max_new_tokens", max_new_tokens, 0), ("top_k", top_k, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ConfigError(f"evaluate: {name}={value!r}: must be a whole number >= {low}")
    if not (isinstance(temperature, (int, float)) and 0 <= temperature < math.inf):
        raise ConfigError(f"evaluate: temperature={temperature!r}: must be a finite number >= 0 (0: greedy)")


def evaluate_checkpoint(checkpoint: str, data: Any, *, split: str = "val", batches: int = 8, batch_size: int = 4,
                        tokenizer: str | None = "llama", prompts: list[str] | None = None,
                        max_new_tokens: int = 24, temperature: float = 0.0, top_k: int = 0,
                        seed: int = 0) -> dict[str, Any]:
    """Validation loss/perplexity of `checkpoint` on `data` (a prepared dataset or its URL) and a sample per
    prompt (greedy, or sampled at ``temperature`` from the ``top_k`` likeliest tokens, seeded by ``seed``)."""
    from stoker.data import open_dataset

    check_settings(batches=batches, batch_size=batch_size, max_new_tokens=max_new_tokens, temperature=temperature,
                   top_k=top_k)  # before the checkpoint is read
    torch.manual_seed(0)
    model = load_model(checkpoint)
    out: dict[str, Any] = validation_loss(model, open_dataset(data, split=split), batches, batch_size)
    out["samples"] = []
    if tokenizer and prompts:
        from stoker.data import load_tokenizer

        tok = load_tokenizer(tokenizer)
        generator = torch.Generator().manual_seed(seed)
        for p in prompts:
            ids = ([tok.bos_id] if tok.bos_id is not None else []) + tok.encode(p)
            new = generate(model, ids, max_new_tokens, temperature=temperature, top_k=top_k, generator=generator)
            out["samples"].append({"prompt": p, "completion": tok.decode(new)})
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
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    ap.add_argument("--top-k", type=int, default=0, help="sample from the k likeliest tokens (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    try:
        result = evaluate_checkpoint(a.checkpoint, a.data, split=a.split, batches=a.batches, tokenizer=a.tokenizer,
                                     prompts=a.prompt, max_new_tokens=a.max_new_tokens, temperature=a.temperature,
                                     top_k=a.top_k, seed=a.seed)
    except StokerError as e:  # one line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
