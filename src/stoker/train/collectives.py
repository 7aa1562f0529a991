"""Cluster validation: repeated all_reduce of a known tensor on every rank, checked and timed.

    torchrun --nnodes N --nproc_per_node M -m stoker.train.collectives --sizes 1K,1M,16M --out result.json

Every rank fills a tensor with 1 and all-reduces it; the sum must equal the world size everywhere. Local rank 0
of each node prints `result OK`; rank 0 reports latency and bus bandwidth (NCCL-tests convention:
busbw = algbw * 2 (n-1) / n) per message size. A wrong value exits non-zero at once; a hang is cut by a
watchdog after --timeout seconds, so a broken fabric fails in seconds, not after a 30-minute collective timeout.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import threading
import time


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().rstrip("B")
    return int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)


def _watchdog(seconds: float, rank: int) -> None:
    def fire() -> None:
        print(f"[rank {rank}] all_reduce did not finish within {seconds:g} s: a rank is hung or the network is "
              f"broken; check every rank's log (stoker logs RUN/STEP)", file=sys.stderr, flush=True)
        os._exit(3)

    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.start()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="stoker.train.collectives", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="4K,256K,4M", help="message sizes in bytes (K/M/G suffixes)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300.0, help="watchdog: fail if the test takes longer")
    ap.add_argument("--out", help="rank 0 writes the results here as JSON")
    ap.add_argument("--corrupt-rank", type=int, default=-1, help=argparse.SUPPRESS)  # tests: a wrong value
    ap.add_argument("--hang-rank", type=int, default=-1, help=argparse.SUPPRESS)  # tests: a hung rank
    args = ap.parse_args(argv)

    import torch
    import torch.distributed as dist

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    _watchdog(args.timeout, rank)
    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout))
    torch.set_num_threads(1)
    results = []
    try:
        for size in [parse_size(s) for s in args.sizes.split(",")]:
            n = max(1, size // 4)
            x = torch.ones(n, dtype=torch.float32, device=device)
            times = []
            for i in range(args.warmup + args.iters):
                x.fill_(2.0 if rank == args.corrupt_rank else 1.0)
                if rank == args.hang_rank:
                    time.sleep(args.timeout * 2)
                if cuda:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                dist.all_reduce(x)
                if cuda:
                    torch.cuda.synchronize()
                if i >= args.warmup:
                    times.append(time.perf_counter() - t0)
                if not torch.all(x == world):
                    bad = x[x != world][0].item()
                    print(f"[rank {rank}] all_reduce returned {bad:g}, expected the world size {world}: a rank "
                          f"computes wrong values (faulty device or driver)", file=sys.stderr, flush=True)
                    return 2
            t = sorted(times)[len(times) // 2]
            algbw = n * 4 / t
            results.append({"bytes": n * 4, "latency_us": t * 1e6, "algbw_gbps": algbw / 1e9,
                            "busbw_gbps": algbw * 2 * (world - 1) / world / 1e9})
        if local_rank == 0:
            print(f"result OK: node rank {os.environ.get('GROUP_RANK', '?')}, world size {world}, backend {backend}",
                  flush=True)
        if rank == 0:
            for r in results:
                print(f"  {r['bytes']:>12,d} B  latency {r['latency_us']:10.1f} us  "
                      f"busbw {r['busbw_gbps']:8.3f} GB/s", flush=True)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump({"world_size": world, "backend": backend, "results": results}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
