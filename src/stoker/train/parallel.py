"""Parallel layout (``ParallelDims``) and ``parallelize``: tensor parallel, FSDP2, activation
checkpointing and ``torch.compile`` applied to an unmodified :class:`~stoker.train.model.Llama`.

Data parallelism comes in two flavours (``dp_mode``):

* ``zero1`` - parameters and gradients replicated over the data-parallel ranks, gradients all-reduced,
  AdamW state sharded (:mod:`stoker.train.zero`); combines with TP on a 2-D ``(dp, tp)`` mesh.
* ``fsdp`` - FSDP2 ``fully_shard`` per transformer block and at the root (parameters, gradients and
  optimizer state sharded); also combines with TP.
* ``ddp`` - plain data parallel: gradients all-reduced, every rank keeps the whole optimizer state.

Precision: parameters (the master weights) and optimizer state stay fp32; ``bf16`` computes in
bfloat16 (FSDP2's ``MixedPrecisionPolicy`` with fp32 gradient reduction, otherwise autocast).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from stoker.errors import ConfigError
from stoker.train.model import Llama
from stoker.train.settings import (  # noqa: F401  ([parallel]'s settings, defined torch-free there; re-exported)
    AC_MODES,
    DP_MODES,
    PRECISIONS,
    LlamaConfig,
    ParallelConfig,
)

log = logging.getLogger(__name__)


@dataclass
class ParallelDims:
    """How ``world_size`` ranks split into data-parallel and tensor-parallel groups.

    Ranks are laid out ``(dp, tp)`` row-major: the TP group of a rank is its neighbours, so TP stays
    within a node when ``tp <= ranks per node``.
    """

    dp: int
    tp: int
    world_size: int
    mesh: DeviceMesh | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ConfigError(f"parallel.tp must be >= 1, got {self.tp}")
        if self.dp == -1:
            if self.world_size % self.tp:
                raise ConfigError(
                    f"world size {self.world_size} is not divisible by parallel.tp={self.tp}; "
                    f"launch a multiple of {self.tp} processes or pick a tp that divides {self.world_size}"
                )
            self.dp = self.world_size // self.tp
        if self.dp < 1:
            raise ConfigError(f"parallel.dp must be >= 1, got {self.dp}")
        if self.dp * self.tp != self.world_size:
            raise ConfigError(
                f"parallel.dp ({self.dp}) x parallel.tp ({self.tp}) = {self.dp * self.tp} but the world size is "
                f"{self.world_size}; set dp = -1 to derive it, or launch {self.dp * self.tp} processes"
            )

    def validate_model(self, cfg: LlamaConfig, *, seq_len: int | None = None, sequence_parallel: bool = False) -> None:
        """Raise ConfigError when the model's shape cannot be split ``tp`` ways."""
        tp = self.tp
        if tp == 1:
            return
        for name in ("n_heads", "n_kv_heads", "ffn_dim", "vocab_size"):
            value = getattr(cfg, name)
            if value % tp:
                divisors = [d for d in range(1, value + 1) if value % d == 0 and d <= 64]
                raise ConfigError(
                    f"parallel.tp={tp} does not divide model.{name}={value}; "
                    f"tensor parallel splits {name} across ranks: use tp in {divisors}"
                )
        if sequence_parallel and seq_len is not None and seq_len % tp:
            raise ConfigError(
                f"sequence parallel splits the sequence ({seq_len} tokens) over tp={tp} ranks; "
                "use a block size divisible by tp or set parallel.sequence_parallel=false"
            )

    @property
    def dp_enabled(self) -> bool:
        return self.dp > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    def build_mesh(self, device_type: str) -> DeviceMesh | None:
        """Create the ``(dp, tp)`` device mesh (needs an initialized process group; None when single-rank)."""
        if self.world_size == 1:
            return None
        self.mesh = init_device_mesh(device_type, (self.dp, self.tp), mesh_dim_names=("dp", "tp"))
        return self.mesh

    @property
    def dp_rank(self) -> int:
        return 0 if self.mesh is None else self.mesh.get_local_rank("dp")

    @property
    def tp_rank(self) -> int:
        return 0 if self.mesh is None else self.mesh.get_local_rank("tp")


def apply_tp(model: Llama, tp_mesh: DeviceMesh, *, sequence_parallel: bool, loss_parallel: bool = False) -> None:
    """Megatron-style tensor parallel: q/k/v and w1/w3 column-wise, wo and w2 row-wise, the embedding
    row-wise (vocab-sharded) and the output column-wise. With sequence parallel the norms and residual
    stream are sharded along the sequence between the blocks. With ``loss_parallel`` the model returns
    its logits as a DTensor sharded on the vocabulary (compute the loss inside :func:`loss_context`, or
    take ``.full_tensor()``); otherwise every TP rank all-gathers the full, replicated logits."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    residual = Shard(1) if sequence_parallel else Replicate()
    top_plan: dict[str, Any] = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=residual),
        "output": ColwiseParallel(input_layouts=residual, output_layouts=Shard(-1) if loss_parallel else Replicate(),
                                  use_local_output=not loss_parallel),
    }
    if sequence_parallel:
        top_plan["norm"] = SequenceParallel()
    parallelize_module(model, tp_mesh, top_plan)
    for block in model.layers.values():
        plan: dict[str, Any] = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=residual),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=residual),
        }
        if sequence_parallel:
            plan.update({
                "attention_norm": SequenceParallel(),
                "ffn_norm": SequenceParallel(),
                # x arrives sequence-sharded, the projections need it whole; cos/sin are plain tensors
                "attention": PrepareModuleInput(
                    input_layouts=(Shard(1), None, None), desired_input_layouts=(Replicate(), None, None)
                ),
                "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            })
        parallelize_module(block, tp_mesh, plan)
    if model.cfg.tie_embeddings:
        # both are Shard(0) over the vocabulary on the same mesh: tie the distributed parameter again
        model.output.weight = model.tok_embeddings.weight


# outputs worth keeping in selective checkpointing: the matmuls and attention; norms, RoPE and the
# SwiGLU activation are cheap to recompute and are what fills activation memory
def _save_list() -> set[Any]:
    aten = torch.ops.aten
    ops = {aten.mm.default, aten.addmm.default, aten.bmm.default}
    for name in (
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    ):
        if hasattr(aten, name):
            ops.add(getattr(aten, name).default)
    return ops


def apply_activation_checkpointing(model: Llama, mode: str) -> None:
    """Recompute each block's activations in backward (``full``), or all but the matmul/attention
    outputs (``selective``). Wraps the block's ``forward`` in place, so parameter names are unchanged."""
    if mode == "none":
        return
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    context_fn = None
    if mode == "selective":
        save = _save_list()

        def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
            return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

        context_fn = functools.partial(create_selective_checkpoint_contexts, policy)
    for block in model.layers.values():
        inner = block.forward
        kwargs: dict[str, Any] = {"use_reentrant": False}
        if context_fn is not None:
            kwargs["context_fn"] = context_fn

        def forward(*args: Any, _inner: Any = inner, _kw: dict[str, Any] = kwargs) -> torch.Tensor:
            return checkpoint(_inner, *args, **_kw)

        block.forward = forward  # type: ignore[method-assign]


def apply_fsdp(model: Llama, dp_mesh: DeviceMesh, *, precision: str) -> None:
    """FSDP2: shard each block, then the root (embedding, final norm, output)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if precision == "bf16" else torch.float32, reduce_dtype=torch.float32
    )
    blocks = list(model.layers.values())
    for i, block in enumerate(blocks):
        # the last block is gathered again right away by backward: keep it unsharded after forward
        fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=i < len(blocks) - 1)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp)


def parallelize(model: Llama, dims: ParallelDims, cfg: ParallelConfig) -> nn.Module:
    """Apply TP, activation checkpointing, compile and FSDP2 (in that order) according to ``cfg``.

    The model should be initialized (``init_weights``) first on every rank with the same seed; TP and
    FSDP then keep each rank's shard of the same full weights. Needs ``dims.build_mesh`` when
    ``world_size > 1``.
    """
    if dims.world_size > 1 and dims.mesh is None:
        raise ConfigError("parallelize: call dims.build_mesh(device_type) after init_process_group first")
    dims.validate_model(model.cfg)
    if dims.tp_enabled:
        assert dims.mesh is not None
        apply_tp(model, dims.mesh["tp"], sequence_parallel=cfg.sequence_parallel,
                 loss_parallel=uses_loss_parallel(dims, cfg))
    apply_activation_checkpointing(model, cfg.activation_checkpoint)
    if cfg.compile:
        for block in model.layers.values():
            block.compile(fullgraph=False)
    if cfg.dp_mode == "fsdp" and dims.dp_enabled:
        assert dims.mesh is not None
        apply_fsdp(model, dims.mesh["dp"], precision=cfg.precision)
    log.info(
        "parallelized: dp=%d (%s) tp=%d sp=%s loss_parallel=%s ac=%s compile=%s precision=%s",
        dims.dp, cfg.dp_mode, dims.tp, cfg.sequence_parallel, uses_loss_parallel(dims, cfg), cfg.activation_checkpoint,
        cfg.compile, cfg.precision,
    )
    return model


def uses_fsdp(dims: ParallelDims, cfg: ParallelConfig) -> bool:
    """Whether ``parallelize`` applied FSDP2 (then FSDP reduces gradients itself)."""
    return cfg.dp_mode == "fsdp" and dims.dp_enabled


def uses_loss_parallel(dims: ParallelDims, cfg: ParallelConfig) -> bool:
    """Whether the model's logits stay sharded on the vocabulary (``parallel.loss_parallel`` with TP)."""
    return cfg.loss_parallel and dims.tp_enabled


def loss_context(enabled: bool) -> contextlib.AbstractContextManager:
    """torch's ``loss_parallel()`` when ``enabled``: cross entropy on vocabulary-sharded DTensor logits, and its
    backward, without gathering the logits; both the loss and ``backward()`` must run inside it."""
    if not enabled:
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()
