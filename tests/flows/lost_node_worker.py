"""A rank of lost_node_flow.py: all_reduce every 50 ms for --seconds (gloo)."""

import argparse
import time

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--seconds", type=float, default=120)
a = ap.parse_args()
dist.init_process_group("gloo")
t, end, n = torch.ones(1), time.time() + a.seconds, 0
while time.time() < end:
    dist.all_reduce(t)
    n += 1
    if n == 1:
        print(f"collective loop started on rank {dist.get_rank()}", flush=True)
    time.sleep(0.05)
dist.destroy_process_group()
