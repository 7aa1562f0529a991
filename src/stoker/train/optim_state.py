"""AdamW state in checkpoints, in one form whatever the data-parallel layout.

For every parameter (by name) the two moments are stored as a tensor of global shape ``[tp, n]``: row
``t`` is tensor-parallel rank ``t``'s local shard, flattened (``n`` elements; ``tp`` is 1 for parameters
that are not sharded over tensor parallelism). ZeRO-1 ranks hold
contiguous slices of a row (``Shard(1)`` over the ``dp`` mesh dimension), replicated optimizers (DDP,
or a single data-parallel rank) hold whole rows (``Replicate()``); the ``tp`` dimension is
``Shard(0)``. ``torch.distributed.checkpoint`` reshards between any of these on load, so a run saved by
ZeRO-1 over 2 ranks resumes on 1, 4 or 8 data-parallel ranks, with ZeRO-1 or without; only the
tensor-parallel degree must stay. (FSDP2 keeps its own sharded optimizer state, which DCP reshards
across data-parallel sizes by itself.)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard

from stoker.train.zero import Zero1AdamW, local_tensor

MOMENTS = ("exp_avg", "exp_avg_sq")


def param_names(model: nn.Module) -> dict[int, str]:
    """id(parameter) -> its first name in the model (tied parameters count once)."""
    names: dict[int, str] = {}
    for name, p in model.named_parameters():
        names.setdefault(id(p), name)
    return names


def _slices(optimizer: Any, model: nn.Module) -> list[tuple[str, nn.Parameter, dict[str, Any], int, int, int]]:
    """(name, parameter, its AdamW state, lo, hi, n): the state holds elements [lo, hi) of the n of the
    parameter's flattened local shard."""
    names = param_names(model)
    out = []
    if isinstance(optimizer, Zero1AdamW):
        for p, shard, (_, _, n, lo, hi) in zip(optimizer.params, optimizer._shards, optimizer._layout, strict=True):
            out.append((names[id(p)], p, optimizer.inner.state[shard], lo, hi, n))
    else:
        for group in optimizer.param_groups:
            for p in group["params"]:
                n = local_tensor(p).numel()
                out.append((names[id(p)], p, optimizer.state[p], 0, n, n))
    return out


def flat_state(optimizer: Any, model: nn.Module, mesh: Any) -> dict[str, Any]:
    """The optimizer's state as DCP-ready tensors (views of the live state: loading fills it in place)."""
    sharded = isinstance(optimizer, Zero1AdamW)
    state: dict[str, Any] = {}
    step = None
    for name, p, st, lo, hi, n in _slices(optimizer, model):
        if not st:  # no step taken yet: nothing to save
            continue
        # else the same tensor on every tensor-parallel rank (plain, or a DTensor replicated over tp such as a
        # sequence-parallel norm weight): stored once, so sequence parallel can be switched between runs
        tp_sharded = isinstance(p, DTensor) and any(isinstance(pl, Shard) for pl in p.placements)
        tp = p.device_mesh.size() if tp_sharded else 1
        for key in MOMENTS:
            local = local_tensor(st[key]).reshape(1, hi - lo)  # a view: the state is contiguous
            if mesh is None:
                state[f"{name}.{key}"] = local
            else:
                placements = (Shard(1) if sharded else Replicate(), Shard(0) if tp_sharded else Replicate())
                state[f"{name}.{key}"] = DTensor.from_local(local, mesh, placements, run_check=False,
                                                            shape=torch.Size((tp, n)), stride=(n, 1))
        step = st["step"]
    if step is not None:
        state["step"] = step if torch.is_tensor(step) else torch.tensor(float(step))
    return state


@torch.no_grad()
def set_step(optimizer: Any, model: nn.Module, step: torch.Tensor) -> None:
    """Give every parameter's state the loaded step count."""
    for _, _, st, _, _, _ in _slices(optimizer, model):
        if "step" not in st:
            continue
        if torch.is_tensor(st["step"]):
            st["step"].copy_(step)
        else:
            st["step"] = float(step)
