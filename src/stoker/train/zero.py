"""ZeRO-1: AdamW whose state (moments) is sharded over the data-parallel ranks.

Parameters and gradients stay replicated across the data-parallel group (and may be tensor-parallel
DTensors). Each dp rank owns the contiguous slice ``[r*c, (r+1)*c)`` of every parameter's flattened
local tensor (``c = ceil(numel / dp)``): it keeps fp32 copies of those slices in one flat buffer, runs
a regular ``torch.optim.AdamW`` over them with its slice of the averaged gradient, and one
``all_gather`` over the dp group rebuilds every parameter. AdamW is element-wise, so the result is
bitwise the update an unsharded AdamW would make; optimizer memory drops by ``dp``.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

log = logging.getLogger(__name__)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The rank-local data of a (possibly distributed) tensor."""
    return t._local_tensor if isinstance(t, DTensor) else t


def adamw_kernel(params: list[torch.Tensor]) -> dict[str, bool]:
    """``fused=True`` (one kernel for all parameters) where torch has it: plain fp32/bf16 tensors on CPU
    or CUDA. DTensors (TP/FSDP) use torch's default multi-tensor path."""
    ok = bool(params) and all(
        not isinstance(p, DTensor) and p.device.type in ("cpu", "cuda") and p.numel() > 0
        and p.dtype in (torch.float32, torch.bfloat16)
        for p in params
    )
    return {"fused": True} if ok else {}


class Zero1AdamW:
    """AdamW with ZeRO stage-1 state sharding over ``dp_group``.

    ``param_groups`` follows ``torch.optim`` (list of dicts with ``params`` and ``weight_decay``);
    schedulers set ``lr`` on :attr:`param_groups` as usual.
    """

    def __init__(
        self,
        param_groups: list[dict[str, Any]],
        *,
        lr: float,
        betas: tuple[float, float],
        eps: float,
        dp_group: dist.ProcessGroup,
        dp_rank: int,
        dp_size: int,
    ) -> None:
        self.dp_group, self.dp_rank, self.dp_size = dp_group, dp_rank, dp_size
        self.params: list[nn.Parameter] = []
        self._layout: list[tuple[int, int, int, int, int]] = []  # (flat offset, chunk, numel, lo, hi)
        offset = 0
        for group in param_groups:
            for p in group["params"]:
                n = local_tensor(p).numel()
                chunk = math.ceil(n / dp_size)
                lo, hi = min(dp_rank * chunk, n), min((dp_rank + 1) * chunk, n)
                self.params.append(p)
                self._layout.append((offset, chunk, n, lo, hi))
                offset += chunk
        device = local_tensor(self.params[0]).device if self.params else torch.device("cpu")
        self._flat = torch.zeros(offset, dtype=torch.float32, device=device)  # this rank's fp32 shards
        self._shards = [self._flat[off : off + (hi - lo)] for off, _, _, lo, hi in self._layout]
        self._copy_params_to_shards()
        inner_groups, i = [], 0
        for group in param_groups:
            k = len(group["params"])
            inner_groups.append({**{key: v for key, v in group.items() if key != "params"},
                                 "params": self._shards[i : i + k]})
            i += k
        self.inner = torch.optim.AdamW(inner_groups, lr=lr, betas=betas, eps=eps, **adamw_kernel(self._shards))

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.inner.param_groups

    @torch.no_grad()
    def _copy_params_to_shards(self) -> None:
        for p, shard, (_, _, _, lo, hi) in zip(self.params, self._shards, self._layout, strict=True):
            shard.copy_(local_tensor(p).detach().reshape(-1)[lo:hi])

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """Update this rank's slices from the (already dp-averaged) gradients, then all-gather."""
        # the parameters are the truth (they may just have been loaded from a checkpoint)
        self._copy_params_to_shards()
        for p, shard, (_, _, _, lo, hi) in zip(self.params, self._shards, self._layout, strict=True):
            g = p.grad
            if isinstance(g, DTensor) and isinstance(p, DTensor) and tuple(g.placements) != tuple(p.placements):
                g = p.grad = g.redistribute(p.device_mesh, p.placements)  # e.g. a replicated embedding grad
            shard.grad = None if g is None else local_tensor(g).reshape(-1)[lo:hi].float()
        self.inner.step()
        for shard in self._shards:
            shard.grad = None
        gathered = torch.empty(self.dp_size * self._flat.numel(), dtype=self._flat.dtype, device=self._flat.device)
        # all_gather_single is all_gather_into_tensor's new name (the old one warns from torch 2.13)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(gathered, self._flat, group=self.dp_group)
        rows = gathered.view(self.dp_size, -1)  # [dp, sum of chunks]
        for p, (off, chunk, n, _, _) in zip(self.params, self._layout, strict=True):
            full = rows[:, off : off + chunk].reshape(-1)[:n]
            local_tensor(p).view(-1).copy_(full)


@torch.no_grad()
def init_adamw_state(optimizer: torch.optim.Optimizer) -> None:
    """Create AdamW's state (zeros, step 1) without changing any parameter, so a checkpoint can load into it."""
    saved = [(g["lr"], g["weight_decay"]) for g in optimizer.param_groups]
    params = [p for g in optimizer.param_groups for p in g["params"]]
    grads = [p.grad for p in params]
    for g in optimizer.param_groups:
        g["lr"], g["weight_decay"] = 0.0, 0.0
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    for p, grad in zip(params, grads, strict=True):
        p.grad = grad
    for g, (lr, wd) in zip(optimizer.param_groups, saved, strict=True):
        g["lr"], g["weight_decay"] = lr, wd
