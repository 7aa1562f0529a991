"""A rank of hang_flow.py: rank 1 never joins the collective rank 0 waits in."""

import threading

import torch
import torch.distributed as dist


def rank_one_never_joins():
    threading.Event().wait()


def rank_zero_waits_in_all_reduce():
    dist.all_reduce(torch.ones(1))


dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} joined the group", flush=True)
if dist.get_rank() == 1:
    rank_one_never_joins()
else:
    rank_zero_waits_in_all_reduce()
