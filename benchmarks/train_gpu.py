"""Tokens/s and MFU of stoker's Llama training step on one accelerator, for a 1B- and an 8B-shaped model.

    python benchmarks/train_gpu.py                          # 1b then 8b on the GPU, bf16, JSON summary
    python benchmarks/train_gpu.py --models 1b --compile    # with torch.compile on each block
    python benchmarks/train_gpu.py --device cpu --tiny      # smoke check without a GPU (tiny shapes)

Recipes (one device, no FSDP needed):
  1b  Llama-3.2-1B shape, fp32 master weights and AdamW state, bf16 autocast, batch 4 x 2048 tokens.
  8b  Llama-3-8B shape, bf16 parameters, gradients and AdamW state (fp32 master weights and state would
      need 128 GB before activations), batch 1 x 4096 tokens, about 110 GB peak (fits an H200/B200); on
      out-of-memory it retries once with full activation checkpointing (recomputation is not counted as
      useful FLOPs, so MFU drops) and reports the error if that fails too (expect it on 80 GB GPUs).

MFU = tokens/s x (6N + 12 L H Q T) / the device's dense bf16 peak (stoker.train.flops, .accelerators).
Weights are drawn N(0, 0.02) on the device (Llama.init_weights draws on the CPU, slow for 8B, and the
values do not change the speed). The whole run needs a few minutes on an H100/H200.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

try:  # run from a checkout without `pip install -e .`: use its src/
    import stoker  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from stoker.train.accelerators import Accelerator, detect
from stoker.train.configs import get_model_config
from stoker.train.flops import achieved_flops, flops_per_token, mfu, num_params
from stoker.train.model import Llama
from stoker.train.optim import build_optimizer, clip_grad_norm
from stoker.train.parallel import ParallelConfig, ParallelDims, parallelize


@dataclass
class Recipe:
    name: str
    config: str
    batch: int
    seq_len: int
    param_dtype: torch.dtype  # fp32: master weights + autocast bf16; bf16: pure bf16 training
    ac: str = "none"
    overrides: dict[str, Any] | None = None


RECIPES = {
    "1b": Recipe("1b", "1b", batch=4, seq_len=2048, param_dtype=torch.float32),
    "8b": Recipe("8b", "llama3-8b", batch=1, seq_len=4096, param_dtype=torch.bfloat16),
}
TINY = {  # same roles, CPU-sized
    "1b": Recipe("1b", "tiny", batch=2, seq_len=64, param_dtype=torch.float32, overrides={"tie_embeddings": True}),
    "8b": Recipe("8b", "tiny", batch=1, seq_len=128, param_dtype=torch.bfloat16, overrides={"n_layers": 4}),
}


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def run_recipe(r: Recipe, acc: Accelerator, *, steps: int, warmup: int, compile_: bool) -> dict[str, Any]:
    dev = acc.set_device(0)
    cfg = get_model_config(r.config, max_seq_len=r.seq_len, **(r.overrides or {}))
    with torch.device(dev), default_dtype(r.param_dtype):
        model = Llama(cfg)  # on the device, in the parameter dtype
    with torch.no_grad():  # a quick on-device init with the usual scale (values do not change the speed)
        for p in model.parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 0.02)
    parallelize(model, ParallelDims(dp=1, tp=1, world_size=1),
                ParallelConfig(activation_checkpoint=r.ac, compile=compile_, precision="bf16"))
    opt = build_optimizer(model, lr=1e-4, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8)
    autocast = (torch.autocast(acc.device_type, dtype=torch.bfloat16) if r.param_dtype == torch.float32
                else contextlib.nullcontext())
    gen = torch.Generator(device="cpu").manual_seed(0)
    data = torch.randint(0, cfg.vocab_size, (steps + warmup, r.batch, r.seq_len + 1), generator=gen).to(dev)

    def step(block: torch.Tensor) -> torch.Tensor:
        with autocast:
            logits = model(block[:, :-1])  # [B, T, V]
        loss = F.cross_entropy(logits.flatten(0, 1).float(), block[:, 1:].flatten())
        loss.backward()
        clip_grad_norm(model, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    t_compile = time.perf_counter()
    first = step(data[0]).item()
    for i in range(1, warmup):
        step(data[i])
    acc.synchronize()
    warm_s = time.perf_counter() - t_compile
    if acc.device_type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for i in range(warmup, warmup + steps):
        last = step(data[i])
    acc.synchronize()
    secs = time.perf_counter() - t0
    tps = r.batch * r.seq_len * steps / secs
    peak = acc.peak_flops(torch.bfloat16)
    mem = acc.memory_stats()
    out = {
        "model": r.name, "config": r.config, "params": num_params(cfg, exclude_embedding=False),
        "batch": r.batch, "seq_len": r.seq_len, "param_dtype": str(r.param_dtype).removeprefix("torch."),
        "compute_dtype": "bfloat16", "activation_checkpoint": r.ac, "compile": compile_,
        "steps": steps, "warmup_s": round(warm_s, 2), "step_s": round(secs / steps, 4),
        "tokens_per_s": round(tps, 1), "flops_per_token": flops_per_token(cfg, r.seq_len),
        "achieved_tflops": round(achieved_flops(tps, cfg, r.seq_len) / 1e12, 2),
        "mfu": None if peak is None else round(mfu(tps, cfg, r.seq_len, peak), 4),
        "peak_mem_gib": round(mem["peak_bytes"] / 2**30, 2),
        "loss_first": round(first, 4), "loss_last": round(last.item(), 4),
    }
    if not (math.isfinite(out["loss_first"]) and math.isfinite(out["loss_last"])):
        out["error"] = "non-finite loss"
    return out


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", help="accelerator: auto, cuda, cpu, neuron")
    ap.add_argument("--models", default="1b,8b", help="comma-separated: 1b, 8b")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes with the same recipes (smoke check)")
    ap.add_argument("--steps", type=int, default=0, help="timed steps (default 10; 2 with --tiny)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (compile happens here)")
    ap.add_argument("--compile", action="store_true", help="torch.compile each transformer block")
    ap.add_argument("--ac", default="", help="activation checkpointing for all models: none/selective/full")
    ap.add_argument("--batch", type=int, default=0, help="override the recipes' batch size")
    ap.add_argument("--seq-len", type=int, default=0, help="override the recipes' sequence length")
    ap.add_argument("--out", default="", help="also write the JSON summary to this file")
    args = ap.parse_args(argv)

    acc = detect(args.device)
    if acc.device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    table = TINY if args.tiny else RECIPES
    steps = args.steps or (2 if args.tiny else 10)
    results = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        if name not in table:
            sys.exit(f"unknown model {name!r}; choose from {sorted(table)}")
        r = table[name]
        if args.ac:
            r.ac = args.ac
        if args.batch:
            r.batch = args.batch
        if args.seq_len:
            r.seq_len = args.seq_len
        tries = [r.ac] + (["full"] if r.ac != "full" and acc.device_type == "cuda" else [])
        for ac in tries:
            r.ac = ac
            try:
                res = run_recipe(r, acc, steps=steps, warmup=args.warmup, compile_=args.compile)
                break
            except torch.cuda.OutOfMemoryError as e:
                res = {"model": r.name, "activation_checkpoint": ac, "error": f"out of memory: {str(e)[:200]}"}
            finally:
                _free()
        results.append(res)
        print(json.dumps(res), file=sys.stderr, flush=True)
    summary = {
        "benchmark": "train_gpu", "device": acc.device_name, "accelerator": acc.name,
        "peak_bf16_tflops": None if acc.peak_flops(torch.bfloat16) is None else acc.peak_flops(torch.bfloat16) / 1e12,
        "torch": torch.__version__, "tiny": args.tiny, "results": results,
    }
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return summary


if __name__ == "__main__":
    main()
