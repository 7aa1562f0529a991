"""Host staging for async checkpoints: a copy of the state in host memory that the background write reads
while training goes on.

The copy lands in buffers allocated at the first save and reused by every later one, as long as the state's
structure, shapes and dtypes stay the same (they are reallocated when they change). Allocating fresh memory
each save, as DCP's default stager does, costs first-touch page faults on every byte (seconds per GB), more
than the copy itself. CUDA tensors are staged into pinned memory when it can be had (non-blocking copies, then
one synchronize); DTensors and ShardedTensors stage their local shards, with DCP's own helpers. The buffers
hold one extra copy of the state in host memory for as long as the Checkpointer lives.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.tensor import DTensor

log = logging.getLogger("stoker.train.checkpoint")


def signature(obj: Any) -> Any:
    """What must stay the same for staged buffers to be reused: the structure, and per tensor its kind, shape,
    dtype and device (per DTensor also its placements, per ShardedTensor its local shards)."""
    if isinstance(obj, DTensor):
        local = obj._local_tensor
        return ("dtensor", tuple(obj.shape), str(obj.placements), tuple(local.shape), local.dtype, local.device.type)
    if isinstance(obj, ShardedTensor):
        return ("sharded", tuple(obj.size()), tuple((tuple(s.metadata.shard_offsets), tuple(s.tensor.shape),
                                                       s.tensor.dtype, s.tensor.device.type)
                                                      for s in obj.local_shards()))
    if isinstance(obj, torch.Tensor):
        return ("tensor", tuple(obj.shape), obj.dtype, obj.device.type)
    if isinstance(obj, dict):
        return ("dict", tuple((k, signature(v)) for k, v in obj.items()))
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, tuple(signature(v) for v in obj))
    return type(obj).__name__  # plain values are taken from the state at every save, never cached


def _on_cuda(obj: Any) -> bool:
    if isinstance(obj, DTensor):
        return obj._local_tensor.is_cuda
    if isinstance(obj, ShardedTensor):
        return any(s.tensor.is_cuda for s in obj.local_shards())
    if isinstance(obj, torch.Tensor):
        return obj.is_cuda
    if isinstance(obj, dict):
        return any(_on_cuda(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_on_cuda(v) for v in obj)
    return False


class HostStager:
    """Copies a state dict into reused host buffers (see the module docstring)."""

    def __init__(self) -> None:
        self.buffers: dict[str, Any] | None = None
        self.key: Any = None
        self.allocations = 0  # how many times buffers were allocated (1 in a steady run)
        self.pinned = False

    def stage(self, state: dict[str, Any]) -> dict[str, Any]:
        """A copy of ``state`` in host memory, complete when this returns (the caller may change ``state``)."""
        state = {k: v.state_dict() if isinstance(v, Stateful) else v for k, v in state.items()}
        key = signature(state)
        cuda = _on_cuda(state)
        if self.buffers is None or key != self.key:
            self.buffers = None  # the old buffers are freed before the new ones are allocated
            self.buffers, self.pinned = self._allocate(state, pin=cuda and torch.cuda.is_available())
            self.key = key
            self.allocations += 1
        staged = _copy_state_dict(state, self.buffers, non_blocking=cuda and self.pinned, type_check=False)
        if cuda:
            torch.cuda.synchronize()  # the copies are done before training changes the state
        return staged

    @staticmethod
    def _allocate(state: dict[str, Any], pin: bool) -> tuple[dict[str, Any], bool]:
        if pin:
            try:
                return _create_cpu_state_dict(state, pin_memory=True, share_memory=False), True
            except RuntimeError as e:  # no pinnable memory (limits, a CPU-only build): pageable buffers work too
                log.warning("staging checkpoints in pageable host memory: pinning failed (%s)", e)
        return _create_cpu_state_dict(state, pin_memory=False, share_memory=False), False
