"""AdamW (no decay on norms/biases), the warmup + linear/cosine LR schedule, data-parallel gradient
averaging and gradient clipping that understand tensor-parallel / FSDP DTensors."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from stoker.train.zero import Zero1AdamW, adamw_kernel, local_tensor  # noqa: F401  (adamw_kernel re-exported)

_BUCKET_ELEMENTS = 32 * 1024 * 1024


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two groups: matrices (and embeddings) decay, vectors (norm weights, biases) do not."""
    decay, no_decay, seen = [], [], set()
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_optimizer(
    model: nn.Module,
    *,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    eps: float,
    zero1_group: dist.ProcessGroup | None = None,
    dp_rank: int = 0,
    dp_size: int = 1,
) -> torch.optim.Optimizer | Zero1AdamW:
    """AdamW over ``model``'s parameters; sharded (ZeRO-1) when ``zero1_group`` is given."""
    groups = param_groups(model, weight_decay)
    if zero1_group is not None and dp_size > 1:
        return Zero1AdamW(groups, lr=lr, betas=betas, eps=eps, dp_group=zero1_group, dp_rank=dp_rank, dp_size=dp_size)
    params = [p for g in groups for p in g["params"]]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, **adamw_kernel(params))


def lr_at(step: int, *, lr: float, min_lr: float, warmup: int, total: int, schedule: str) -> float:
    """Learning rate of optimizer step ``step`` (0-based): linear warmup over ``warmup`` steps, then
    ``cosine``/``linear`` decay to ``min_lr`` at ``total`` steps, or ``constant``."""
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    if schedule == "constant":
        return lr
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "cosine":
        return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return lr - (lr - min_lr) * progress


class LRSchedule:
    """Sets each param group's ``lr`` for the coming step; its state is the step counter."""

    def __init__(self, optimizer: Any, *, lr: float, min_lr: float, warmup: int, total: int, schedule: str) -> None:
        self.optimizer = optimizer
        self.kw = {"lr": lr, "min_lr": min_lr, "warmup": warmup, "total": total, "schedule": schedule}
        self.step_count = 0

    def apply(self) -> float:
        """Set the lr for optimizer step ``step_count`` and return it."""
        value = lr_at(self.step_count, **self.kw)
        for group in self.optimizer.param_groups:
            group["lr"] = value
        return value

    def step(self) -> None:
        self.step_count += 1

    def state_dict(self) -> dict[str, Any]:
        return {"step_count": self.step_count, **self.kw}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.step_count = int(sd["step_count"])


@torch.no_grad()
def align_grads(model: nn.Module) -> None:
    """Give every DTensor gradient its parameter's placements. Autograd may hand back another layout
    (the vocab-sharded embedding gets a replicated gradient, sequence-parallel norms a partial one);
    sharded optimizers, the data-parallel all-reduce and the norm all need the parameter's layout."""
    for p in _unique_params(model):
        g = p.grad
        if isinstance(g, DTensor) and isinstance(p, DTensor) and tuple(g.placements) != tuple(p.placements):
            p.grad = g.redistribute(p.device_mesh, p.placements)


@torch.no_grad()
def allreduce_grads(model: nn.Module, group: dist.ProcessGroup, size: int) -> None:
    """Average gradients over a data-parallel group, in flat buckets (gloo has no AVG: sum, divide)."""
    grads = [local_tensor(p.grad) for p in _unique_params(model) if p.grad is not None]
    buckets: list[list[torch.Tensor]] = []
    current: list[torch.Tensor] = []
    count = 0
    for g in grads:
        if current and count + g.numel() > _BUCKET_ELEMENTS:
            buckets.append(current)
            current, count = [], 0
        current.append(g)
        count += g.numel()
    if current:
        buckets.append(current)
    for bucket in buckets:
        flat = torch.cat([b.reshape(-1) for b in bucket])
        dist.all_reduce(flat, group=group)
        flat.div_(size)
        off = 0
        for b in bucket:
            b.view(-1).copy_(flat[off : off + b.numel()])
            off += b.numel()


def _unique_params(model: nn.Module) -> list[nn.Parameter]:
    return list({id(p): p for p in model.parameters()}.values())


@torch.no_grad()
def clip_grad_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Global L2 norm of all gradients (over TP / FSDP shards, each element counted once); scales
    them to ``max_norm`` when above (``max_norm <= 0``: measure only). Returns the norm before clipping."""
    groups: dict[tuple[int, tuple[int, ...]], tuple[Any, list[torch.Tensor]]] = {}
    for p in _unique_params(model):
        g = p.grad
        if g is None:
            continue
        if isinstance(g, DTensor):
            if isinstance(p, DTensor) and tuple(g.placements) != tuple(p.placements):
                g = p.grad = g.redistribute(p.device_mesh, p.placements)
            dims = tuple(i for i, pl in enumerate(g.placements) if pl.is_shard())
            key, mesh = (id(g.device_mesh), dims), g.device_mesh
        else:
            key, mesh = (0, ()), None
        groups.setdefault(key, (mesh, []))[1].append(local_tensor(g))
    device = next(iter(groups.values()))[1][0].device if groups else torch.device("cpu")
    total_sq = torch.zeros((), dtype=torch.float32, device=device)
    all_locals: list[torch.Tensor] = []
    for (_, shard_dims), (mesh, locals_) in groups.items():
        norms = torch._foreach_norm([t.float() if t.dtype != torch.float32 else t for t in locals_])
        sq = torch.stack(norms).pow(2).sum()
        for d in shard_dims:
            dist.all_reduce(sq, group=mesh.get_group(d))
        total_sq += sq
        all_locals.extend(locals_)
    total = total_sq.sqrt()
    if max_norm > 0 and all_locals:
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        torch._foreach_mul_(all_locals, coef)
    return total
