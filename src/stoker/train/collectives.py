"""Cluster validation: repeated all_reduce of a known tensor on every rank, checked and timed.

    torchrun --nnodes N --nproc_per_node M -m stoker.train.collectives --sizes 1K,1M,16M --out result.json

Every rank fills a tensor with 1 and all-reduces it; the sum must equal the world size everywhere. Local rank 0
of each node prints `result OK`; rank 0 reports latency and bus bandwidth (NCCL-tests convention:
busbw = algbw * 2 (n-1) / n) per message size. A wrong value exits non-zero at once; a hang is cut by a
watchdog after --timeout seconds, so a broken fabric fails in seconds, not after a 30-minute collective timeout.

The backend is the real one of the node (`--backend auto`): NCCL on CUDA; XLA on Neuron when torch_xla is
importable (torch-neuronx: `dist.init_process_group("xla")`, `xm.all_reduce` on the XLA device, one compiled
graph per message size, so keep --warmup >= 1); gloo on CPU. `--node-out` has local rank 0 of every node write
what it measured (the gang preflight, stoker.distributed.preflight, reads it on each node).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import re
import sys
import threading
import time
from typing import Any

BACKENDS = ("auto", "gloo", "nccl", "xla")


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().rstrip("B")
    return int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)


def _watchdog(seconds: float, rank: int) -> threading.Timer:
    def fire() -> None:
        print(f"[rank {rank}] all_reduce did not finish within {seconds:g} s: a rank is hung or the network is "
              f"broken; check every rank's log (stoker logs RUN/STEP)", file=sys.stderr, flush=True)
        os._exit(3)

    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.start()
    return t


def _neuron_here(dev_dir: str = "/dev") -> bool:
    try:
        return any(re.fullmatch(r"neuron\d+", n) for n in os.listdir(dev_dir))
    except OSError:
        return False


def pick_backend(requested: str = "auto", *, cuda: bool | None = None, xla: bool | None = None,
                 neuron: bool | None = None) -> str:
    """The process-group backend for `requested`: `auto` is nccl with CUDA, xla with torch_xla on a Neuron
    node (or PJRT_DEVICE=NEURON), else gloo."""
    if requested != "auto":
        return requested
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    if cuda:
        return "nccl"
    if xla is None:
        xla = importlib.util.find_spec("torch_xla") is not None
    if neuron is None:
        neuron = _neuron_here() or os.environ.get("PJRT_DEVICE", "").upper() == "NEURON"
    return "xla" if xla and neuron else "gloo"


class _Torch:
    """nccl / gloo: a tensor on the rank's CUDA device or the CPU, torch.distributed's all_reduce."""

    def __init__(self, backend: str, local_rank: int, timeout: float) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        self.cuda = backend == "nccl"
        self.device = torch.device(f"cuda:{local_rank}" if self.cuda else "cpu")
        if self.cuda:
            torch.cuda.set_device(self.device)
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
        torch.set_num_threads(1)

    def tensor(self, n: int, value: float) -> Any:
        return self.torch.full((n,), value, dtype=self.torch.float32, device=self.device)

    def all_reduce(self, x: Any) -> Any:
        if self.cuda:
            self.torch.cuda.synchronize()
        self.dist.all_reduce(x)
        if self.cuda:
            self.torch.cuda.synchronize()
        return x

    def values(self, x: Any) -> Any:
        return x

    def barrier(self) -> None:
        self.dist.barrier()

    def close(self) -> None:
        self.dist.destroy_process_group()


class _Xla:
    """Neuron (torch-neuronx) and other XLA devices, from torch_xla's documented API: the `xla` process group
    (registered by `torch_xla.distributed.xla_backend`, rendezvous from torchrun's environment), the rank's XLA
    device (`xm.xla_device()`), `xm.all_reduce(xm.REDUCE_SUM, x)` materialized by `xm.mark_step()` and waited
    for with `xm.wait_device_ops()`. Not run in stoker's own tests: no Neuron device or torch_xla there."""

    def __init__(self, timeout: float) -> None:
        import torch
        import torch.distributed as dist
        import torch_xla.core.xla_model as xm
        import torch_xla.distributed.xla_backend  # noqa: F401 - registers the "xla" backend

        self.torch, self.dist, self.xm = torch, dist, xm
        dist.init_process_group("xla", timeout=datetime.timedelta(seconds=timeout))
        self.device = xm.xla_device()

    def tensor(self, n: int, value: float) -> Any:
        return self.torch.full((n,), value, dtype=self.torch.float32, device=self.device)

    def all_reduce(self, x: Any) -> Any:
        y = self.xm.all_reduce(self.xm.REDUCE_SUM, x)
        self.xm.mark_step()  # runs the traced graph (compiled once per shape: the warm-up iterations)
        self.xm.wait_device_ops()
        return y

    def values(self, x: Any) -> Any:
        return x.cpu()

    def barrier(self) -> None:
        self.xm.rendezvous("stoker.train.collectives")

    def close(self) -> None:
        self.dist.destroy_process_group()


def measure(comm: Any, sizes: list[int], *, rank: int, world: int, iters: int, warmup: int,
            corrupt_rank: int = -1, hang_rank: int = -1, hang_s: float = 0.0) -> list[dict[str, float]]:
    """Latency and bandwidth per message size; raises ValueError on a wrong sum (faulty device or driver)."""
    results = []
    for size in sizes:
        n = max(1, size // 4)
        times = []
        for i in range(warmup + iters):
            x = comm.tensor(n, 2.0 if rank == corrupt_rank else 1.0)
            if rank == hang_rank:
                time.sleep(hang_s)
            t0 = time.perf_counter()
            y = comm.all_reduce(x)
            dt = time.perf_counter() - t0
            if i >= warmup:
                times.append(dt)
            v = comm.values(y)
            if not bool((v == world).all()):
                bad = v[v != world][0].item()
                raise ValueError(f"all_reduce returned {bad:g}, expected the world size {world}: a rank computes "
                                 f"wrong values (faulty device or driver)")
        t = sorted(times)[len(times) // 2] if times else float("nan")
        algbw = n * 4 / t
        results.append({"bytes": n * 4, "latency_us": t * 1e6, "algbw_gbps": algbw / 1e9,
                        "busbw_gbps": algbw * 2 * (world - 1) / world / 1e9})
    return results


def _write(path: str, doc: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="stoker.train.collectives", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="4K,256K,4M", help="message sizes in bytes (K/M/G suffixes)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300.0, help="watchdog: fail if the test takes longer")
    ap.add_argument("--backend", choices=BACKENDS, default="auto",
                    help="process group: auto (nccl on CUDA, xla on Neuron with torch_xla, else gloo)")
    ap.add_argument("--out", help="rank 0 writes the results here as JSON")
    ap.add_argument("--node-out", help="local rank 0 of every node writes what it measured here as JSON")
    ap.add_argument("--corrupt-rank", type=int, default=-1, help=argparse.SUPPRESS)  # tests: a wrong value
    ap.add_argument("--hang-rank", type=int, default=-1, help=argparse.SUPPRESS)  # tests: a hung rank
    args = ap.parse_args(argv)
    try:
        sizes = [parse_size(s) for s in args.sizes.split(",")]
    except (ValueError, KeyError, IndexError):
        ap.error(f"argument --sizes: {args.sizes!r} is not a list of sizes such as 4K,256K,4M")
    if min(sizes) < 1 or args.iters < 1 or args.warmup < 0 or not args.timeout > 0:
        ap.error("--sizes must be >= 1 byte, --iters >= 1, --warmup >= 0 and --timeout > 0")
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        print("error: stoker.train.collectives runs under torchrun, which sets RANK and WORLD_SIZE: "
              "torchrun --nproc-per-node 2 -m stoker.train.collectives", file=sys.stderr)
        return 2

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    _watchdog(args.timeout, rank)
    backend = pick_backend(args.backend)
    comm = _Xla(args.timeout) if backend == "xla" else _Torch(backend, local_rank, args.timeout)
    try:
        try:
            results = measure(comm, sizes, rank=rank, world=world, iters=args.iters, warmup=args.warmup,
                              corrupt_rank=args.corrupt_rank, hang_rank=args.hang_rank, hang_s=args.timeout * 2)
        except ValueError as e:
            print(f"[rank {rank}] {e}", file=sys.stderr, flush=True)
            return 2
        doc = {"world_size": world, "backend": backend, "results": results}
        if local_rank == 0:
            print(f"result OK: node rank {os.environ.get('GROUP_RANK', '?')}, world size {world}, backend {backend}",
                  flush=True)
            if args.node_out:
                _write(args.node_out, {**doc, "node_rank": os.environ.get("GROUP_RANK", "?")})
        if rank == 0:
            for r in results:
                print(f"  {r['bytes']:>12,d} B  latency {r['latency_us']:10.1f} us  "
                      f"busbw {r['busbw_gbps']:8.3f} GB/s", flush=True)
            if args.out:
                _write(args.out, doc)
        comm.barrier()
    finally:
        comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
