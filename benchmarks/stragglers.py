"""Straggler detection's cost (stoker.train.stragglers) on the CPU tiny-model trainer, in one run.

    python benchmarks/stragglers.py                   # tiny model, batch 8 x 128 tokens, 1 thread
    python benchmarks/stragglers.py --rounds 20 --json

Two measurements:

1. End to end: ``Trainer.fit`` resumed for ``--steps`` steps per round, alternately with ``stragglers.enabled`` on and
   off (so that other load on the machine hits both alike); the median step time (wall and the process's CPU time)
   of each side and the median of the per-round ratios. On a shared machine this figure is only as steady as the
   machine: it cannot resolve 1 %.
2. Piece by piece, the steady figure: the timer's calls in one step (``begin``, a mark per phase, the test hook's
   no-op) against the null timer's, timed over many repetitions; the window's work (the timer's ``take``, one
   ``all_gather`` of 4 numbers between 2 gloo processes on this machine, and rank 0's scoring of 2 and of 1,024
   ranks) divided by the window's steps. Their sum over the measured step time is the overhead (target < 1 %).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

try:  # run from a checkout without `pip install -e .`: use its src/
    import stoker  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from stoker.train.config import from_dict
from stoker.train.stragglers import COLLECTIVE, COMPUTE, DATA, NULL_TIMER, Figures, StepTimer, StragglerDetector
from stoker.train.trainer import Trainer


def trainer(args: argparse.Namespace, workdir: Path, total: int) -> Trainer:
    tokens = workdir / "tokens.bin"
    n = (args.seq_len + 1) * args.batch * (total + 1)
    np.random.default_rng(0).integers(0, 256, n, dtype=np.uint16).tofile(tokens)
    return Trainer(from_dict({
        "out_dir": str(workdir / "run"), "model": {"name": "tiny", "max_seq_len": args.seq_len},
        "data": {"url": str(tokens), "block_size": args.seq_len + 1},
        "train": {"steps": total, "micro_batch_size": args.batch, "lr": 3e-4, "log_every": args.window,
                  "accelerator": "cpu"},
        "checkpoint": {"save_final": False, "resume": "never"}, "metrics": {"progress": False, "tensorboard": False},
    }))


def end_to_end(args: argparse.Namespace) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="stoker-stragglers-"))
    try:
        t = trainer(args, workdir, args.warmup + 2 * args.rounds * args.steps)
        t.cfg.train.stop_after = args.warmup
        t.fit()
        times: dict[str, list[float]] = {"on": [], "off": []}
        cpu: dict[str, list[float]] = {"on": [], "off": []}
        for r in range(args.rounds):
            for side in ("on", "off") if r % 2 == 0 else ("off", "on"):
                t.cfg.stragglers.enabled = side == "on"
                t.cfg.train.stop_after = t.step + args.steps
                t0, c0 = time.perf_counter(), time.process_time()
                t.fit()
                times[side].append((time.perf_counter() - t0) / args.steps)
                cpu[side].append((time.process_time() - c0) / args.steps)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    ratios = [a / b for a, b in zip(times["on"], times["off"], strict=True)]
    cpu_ratios = [a / b for a, b in zip(cpu["on"], cpu["off"], strict=True)]
    return {"step_ms": {k: round(statistics.median(v) * 1000, 3) for k, v in times.items()},
            "step_cpu_ms": {k: round(statistics.median(v) * 1000, 3) for k, v in cpu.items()},
            "ratio_rounds": [round(x, 4) for x in ratios], "ratio_paired_median": round(statistics.median(ratios), 4),
            "cpu_ratio_paired_median": round(statistics.median(cpu_ratios), 4)}


def per_step_calls(timer, reps: int) -> float:
    """Seconds per step of the timer calls train_step makes (accumulation 1)."""
    t0 = time.perf_counter()
    for _ in range(reps):
        timer.begin()
        timer.mark(DATA)
        timer.mark(COMPUTE)
        timer.slow()
        timer.mark(COMPUTE)
        timer.mark(COLLECTIVE)
    return (time.perf_counter() - t0) / reps


def _gather_worker(rank: int, port: int, reps: int, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    t = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    bufs = [torch.empty_like(t) for _ in range(2)]
    for _ in range(10):
        dist.all_gather(bufs, t)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        dist.all_gather(bufs, t)
        [b.tolist() for b in bufs]
    took = (time.perf_counter() - t0) / reps
    if rank == 0:
        Path(out).write_text(json.dumps(took))
    dist.barrier()
    dist.destroy_process_group()


def gather_cost(reps: int) -> float:
    """Seconds of one all_gather of 4 float64 between 2 gloo processes on this machine."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tempfile.mktemp(suffix=".json")
    mp.spawn(_gather_worker, args=(port, reps, out), nprocs=2)
    took = json.loads(Path(out).read_text())
    os.unlink(out)
    return took


def scoring_cost(ranks: int, reps: int) -> float:
    d = StragglerDetector(nodes=[r // 8 for r in range(ranks)], hosts=[f"n{r // 8}" for r in range(ranks)])
    rng = np.random.default_rng(0)
    figs = [[Figures(x, 0.001, 0.01) for x in rng.uniform(0.45, 0.55, ranks)] for _ in range(reps)]
    t0 = time.perf_counter()
    for i, f in enumerate(figs):
        d.update(f, first_step=i, step=i)
    return (time.perf_counter() - t0) / reps


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per side per round")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--window", type=int, default=10, help="stragglers' window (train.log_every)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print only the JSON summary")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    e2e = end_to_end(args)
    reps = 200_000
    timer = StepTimer()
    calls = per_step_calls(timer, reps) - per_step_calls(NULL_TIMER, reps)
    t0 = time.perf_counter()
    for _ in range(reps // 10):
        timer.take()
    take = (time.perf_counter() - t0) / (reps // 10)
    gather = gather_cost(2000)
    score2, score1024 = scoring_cost(2, 2000), scoring_cost(1024, 50)
    step_s = e2e["step_ms"]["off"] / 1000
    window_s = take + gather + score2
    overhead = (calls + window_s / args.window) / step_s
    summary = {
        "benchmark": "stragglers", "model": "tiny", "batch": args.batch, "seq_len": args.seq_len,
        "threads": args.threads, "window": args.window, "torch": torch.__version__, "end_to_end": e2e,
        "timer_calls_per_step_us": round(calls * 1e6, 3), "take_us": round(take * 1e6, 3),
        "all_gather_2_ranks_us": round(gather * 1e6, 1), "scoring_us": {"2": round(score2 * 1e6, 1),
                                                                          "1024": round(score1024 * 1e6, 1)},
        "overhead_per_step_us": round((calls + window_s / args.window) * 1e6, 2),
        "overhead_percent": round(overhead * 100, 4),
        "overhead_percent_1024_ranks": round((calls + (take + gather + score1024) / args.window) / step_s * 100, 4),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(json.dumps(summary, indent=2))
        print(f"step {e2e['step_ms']['off']:.2f} ms (off) vs {e2e['step_ms']['on']:.2f} ms (on), paired ratio "
              f"{e2e['ratio_paired_median']:.4f} (CPU time {e2e['cpu_ratio_paired_median']:.4f}); piece by piece: "
              f"{summary['overhead_per_step_us']:.1f} us per step = {summary['overhead_percent']:.3f} % of the step "
              "(target < 1 %)")
    return summary


if __name__ == "__main__":
    main()
