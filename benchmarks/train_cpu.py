"""stoker's training step vs a plain transformers training loop, on CPU, in one run.

Both sides train the same tiny Llama (same config, same initial weights, same batch and sequence
length, fp32, AdamW with weight decay 0.1, gradient clipping 1.0, a warmup + cosine schedule) on the same
random token batches. They run in alternating rounds so that noise from other processes on the
machine hits both alike; the result is the median tokens/s of each side and their ratio (target >= 1.0).

    python benchmarks/train_cpu.py                      # tiny config, batch 8 x 128 tokens
    python benchmarks/train_cpu.py --model small --seq-len 256 --batch 4 --rounds 3

stoker side: ``stoker.train.trainer``'s step when the trainer exposes one, else the pieces it is built
from (``Llama`` + ``parallelize`` + ``build_optimizer`` + ``LRSchedule`` + ``clip_grad_norm``).
transformers side: ``LlamaForCausalLM(..., attn_implementation="sdpa")`` with ``torch.optim.AdamW`` and
``get_cosine_schedule_with_warmup``, the loop a user would write from the transformers docs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
import transformers

from stoker.train.configs import get_model_config
from stoker.train.flops import achieved_flops
from stoker.train.hf import to_hf_config, to_hf_state_dict
from stoker.train.model import Llama
from stoker.train.optim import LRSchedule, build_optimizer, clip_grad_norm
from stoker.train.parallel import ParallelConfig, ParallelDims, parallelize

LR, WD, BETAS, EPS, CLIP, WARMUP = 3e-4, 0.1, (0.9, 0.95), 1e-8, 1.0, 2


def stoker_side(cfg, total_steps: int, seed: int) -> tuple[Llama, Callable[[torch.Tensor], float]]:
    model = Llama(cfg)
    model.init_weights(seed)
    parallelize(model, ParallelDims(dp=1, tp=1, world_size=1), ParallelConfig())
    opt = build_optimizer(model, lr=LR, weight_decay=WD, betas=BETAS, eps=EPS)
    sched = LRSchedule(opt, lr=LR, min_lr=0.0, warmup=WARMUP, total=total_steps, schedule="cosine")

    def step(block: torch.Tensor) -> float:  # block [B, T+1]
        sched.apply()
        inputs, targets = block[:, :-1], block[:, 1:]
        logits = model(inputs)  # [B, T, V]
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        loss.backward()
        clip_grad_norm(model, CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        return loss.item()

    return model, step


def hf_side(cfg, init: Llama, total_steps: int) -> Callable[[torch.Tensor], float]:
    model = transformers.LlamaForCausalLM(to_hf_config(cfg, attn_implementation="sdpa"))
    model.load_state_dict(to_hf_state_dict(init.state_dict(), cfg), strict=not cfg.tie_embeddings)
    if cfg.tie_embeddings:
        model.tie_weights()
    model.train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS)
    sched = transformers.get_cosine_schedule_with_warmup(opt, WARMUP, total_steps)

    def step(block: torch.Tensor) -> float:
        # shift_labels: the same T targets as the stoker side (labels=inputs would drop the last one)
        loss = model(input_ids=block[:, :-1], labels=block[:, :-1], shift_labels=block[:, 1:].contiguous()).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return step


def timed(step: Callable[[torch.Tensor], float], batches: list[torch.Tensor]) -> tuple[float, float]:
    t0 = time.perf_counter()
    loss = 0.0
    for b in batches:
        loss = step(b)
    return time.perf_counter() - t0, loss


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="named stoker model config (default: tiny)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per side per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per side first")
    ap.add_argument("--threads", type=int, default=min(4, os.cpu_count() or 1))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print only the JSON summary")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    cfg = get_model_config(args.model, max_seq_len=args.seq_len)
    total = args.warmup + args.steps * args.rounds
    gen = torch.Generator().manual_seed(args.seed)
    batches = [torch.randint(0, cfg.vocab_size, (args.batch, args.seq_len + 1), generator=gen) for _ in range(total)]

    model, stoker_step = stoker_side(cfg, total, args.seed)
    hf_step = hf_side(cfg, model, total)  # same initial weights
    first = (stoker_step(batches[0]), hf_step(batches[0]))  # step 0 losses must agree: same model, same data
    for b in batches[1:args.warmup]:
        stoker_step(b)
        hf_step(b)

    tokens = args.batch * args.seq_len * args.steps
    rates: dict[str, list[float]] = {"stoker": [], "transformers": []}
    final: dict[str, float] = {}
    for r in range(args.rounds):
        chunk = batches[args.warmup + r * args.steps: args.warmup + (r + 1) * args.steps]
        order = [("stoker", stoker_step), ("transformers", hf_step)]
        for name, step in order if r % 2 == 0 else order[::-1]:
            secs, final[name] = timed(step, chunk)
            rates[name].append(tokens / secs)
    med = {k: statistics.median(v) for k, v in rates.items()}
    summary = {
        "benchmark": "train_cpu", "model": args.model, "params": model.num_params(), "batch": args.batch,
        "seq_len": args.seq_len, "threads": args.threads, "steps_per_round": args.steps, "rounds": args.rounds,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "tokens_per_s": {k: round(v, 1) for k, v in med.items()},
        "tokens_per_s_rounds": {k: [round(x, 1) for x in v] for k, v in rates.items()},
        "achieved_gflops": {k: round(achieved_flops(v, cfg, args.seq_len) / 1e9, 2) for k, v in med.items()},
        "first_loss": {"stoker": round(first[0], 5), "transformers": round(first[1], 5)},
        "final_loss": {k: round(v, 4) for k, v in final.items()},
        "ratio": round(med["stoker"] / med["transformers"], 3),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(json.dumps(summary, indent=2))
        print(f"stoker {med['stoker']:.0f} tok/s vs transformers {med['transformers']:.0f} tok/s: "
              f"ratio {summary['ratio']:.2f}x (target >= 1.0)")
    return summary


if __name__ == "__main__":
    main()
