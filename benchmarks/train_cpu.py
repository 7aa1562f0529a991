"""stoker's trainer vs a plain transformers training loop, on CPU, in one run.

Both sides train the same tiny Llama (same config, same initial weights, same batches of the same token
file, batch and sequence length, fp32, AdamW with weight decay 0.1 on matrices only, gradient clipping 1.0,
warmup + cosine schedule, each library's own). They run in alternating rounds so that noise from other processes on the
machine hits both alike; the result is the median tokens/s of each side and their ratio (target >= 1.0).

    python benchmarks/train_cpu.py                      # tiny config, batch 8 x 128 tokens
    python benchmarks/train_cpu.py --model small --seq-len 256 --batch 4 --rounds 3

stoker side: ``stoker.train.trainer.Trainer.fit`` (its data loader, LR schedule, step, NaN check and
metrics logging; progress bar, TensorBoard and checkpoints off), resumed for ``--steps`` more steps per
round. transformers side: ``LlamaForCausalLM`` (default SDPA attention) with ``torch.optim.AdamW`` and
``get_cosine_schedule_with_warmup`` over the same batches, already in memory: the loop a user would write
from the transformers docs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import transformers

try:  # run from a checkout without `pip install -e .`: use its src/
    import stoker  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from stoker.train.config import from_dict
from stoker.train.configs import get_model_config
from stoker.train.flops import achieved_flops
from stoker.train.hf import to_hf_config, to_hf_state_dict
from stoker.train.model import Llama
from stoker.train.trainer import Trainer

LR, WD, BETAS, EPS, CLIP, WARMUP = 3e-4, 0.1, (0.9, 0.95), 1e-8, 1.0, 2


def stoker_side(args: argparse.Namespace, workdir: Path, total_steps: int) -> Trainer:
    vocab = get_model_config(args.model).vocab_size
    dtype = "uint16" if vocab <= 65536 else "uint32"
    tokens = workdir / "tokens.bin"
    n = (args.seq_len + 1) * args.batch * (total_steps + 1)
    np.random.default_rng(args.seed).integers(0, vocab, n, dtype=np.dtype(dtype)).tofile(tokens)
    cfg = from_dict({
        "out_dir": str(workdir / "run"),
        "model": {"name": args.model, "max_seq_len": args.seq_len},
        "data": {"url": str(tokens), "block_size": args.seq_len + 1, "shuffle": True, "token_dtype": dtype},
        "train": {"steps": total_steps, "micro_batch_size": args.batch, "lr": LR, "warmup_steps": WARMUP,
                  "schedule": "cosine", "weight_decay": WD, "beta1": BETAS[0], "beta2": BETAS[1], "eps": EPS,
                  "grad_clip": CLIP, "seed": args.seed, "log_every": args.steps, "accelerator": "cpu"},
        "checkpoint": {"save_final": False, "resume": "never"},
        "metrics": {"progress": False, "tensorboard": False},
    })
    return Trainer(cfg)


def run_stoker(trainer: Trainer, steps: int) -> float:
    """Continue the trainer's fit() for ``steps`` more steps; returns the last loss."""
    trainer.cfg.train.stop_after = trainer.step + steps
    return float(trainer.fit()["final_loss"])


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


def timed(step: Callable[[torch.Tensor], float], batches: list[torch.Tensor]) -> float:
    loss = 0.0
    for b in batches:
        loss = step(b)
    return loss


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="named stoker model config (default: tiny)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per side per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per side first")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads per side (default 1: steady on a shared machine)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print only the JSON summary")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    total = args.warmup + args.steps * args.rounds
    workdir = Path(tempfile.mkdtemp(prefix="stoker-bench-"))
    trainer = stoker_side(args, workdir, total)
    cfg = trainer.model_cfg
    hf_step = hf_side(cfg, trainer.model, total)  # same initial weights
    # the same batches, in the same order, as the trainer's loader (same dataset, seed and shuffle)
    from stoker.train.data_source import make_loader

    loader = make_loader(trainer.dataset, batch_size=args.batch, dp_rank=0, dp_size=1, seed=args.seed, shuffle=True)
    batches = [torch.from_numpy(next(loader)) for _ in range(total)]

    trainer.cfg.train.stop_after = args.warmup
    first = (trainer.fit()["losses"][0], hf_step(batches[0]))  # same model, same data: these must agree
    for b in batches[1:args.warmup]:
        hf_step(b)

    tokens = args.batch * args.seq_len * args.steps
    rates: dict[str, list[float]] = {"stoker": [], "transformers": []}
    final: dict[str, float] = {}
    for r in range(args.rounds):
        chunk = batches[args.warmup + r * args.steps: args.warmup + (r + 1) * args.steps]
        for name in ("stoker", "transformers") if r % 2 == 0 else ("transformers", "stoker"):
            t0 = time.perf_counter()
            final[name] = run_stoker(trainer, args.steps) if name == "stoker" else timed(hf_step, chunk)
            rates[name].append(tokens / (time.perf_counter() - t0))
    med = {k: statistics.median(v) for k, v in rates.items()}
    summary = {
        "benchmark": "train_cpu", "model": args.model, "params": trainer.model.num_params(), "batch": args.batch,
        "seq_len": args.seq_len, "threads": args.threads, "steps_per_round": args.steps, "rounds": args.rounds,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "tokens_per_s": {k: round(v, 1) for k, v in med.items()},
        "tokens_per_s_rounds": {k: [round(x, 1) for x in v] for k, v in rates.items()},
        "achieved_gflops": {k: round(achieved_flops(v, cfg, args.seq_len) / 1e9, 2) for k, v in med.items()},
        "first_loss": {"stoker": round(first[0], 5), "transformers": round(first[1], 5)},
        "final_loss": {k: round(v, 4) for k, v in final.items()},
        "ratio": round(med["stoker"] / med["transformers"], 3),
        # per-round ratios (each round runs both sides back to back): robust to load that drifts
        "ratio_rounds": [round(a / b, 3) for a, b in zip(rates["stoker"], rates["transformers"], strict=True)],
    }
    summary["ratio_paired_median"] = round(statistics.median(summary["ratio_rounds"]), 3)
    shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps(summary))
    else:
        print(json.dumps(summary, indent=2))
        print(f"stoker {med['stoker']:.0f} tok/s vs transformers {med['transformers']:.0f} tok/s: "
              f"ratio {summary['ratio']:.2f}x, median of per-round ratios {summary['ratio_paired_median']:.2f}x "
              "(target >= 1.0)")
    return summary


if __name__ == "__main__":
    main()
