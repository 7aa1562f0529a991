"""Every setting of ``stoker.train``, in one torch-free module: one dataclass per TOML section and the named
model shapes.

    [model]       ModelSection: a named shape (MODEL_CONFIGS) plus any LlamaConfig field, or init_from
    [data]        DataSection
    [train]       TrainSection (steps, batch, optimizer, schedule, ...)
    [parallel]    ParallelConfig
    [checkpoint]  CheckpointSection
    [metrics]     MetricsSection
    [stragglers]  StragglersSection
    out_dir       TrainConfig, which holds them all

Each field carries its help text (``field_help(TrainSection)["lr"]``) and each class validates itself in
``__post_init__``. Importing this module imports no torch, so the pre-submit checks of a recipe, a flow's
config check and ``--help`` read the same definitions the trainer uses. Reading a TOML file, the
``section.key=value`` overrides and their type checks live in :mod:`stoker.train.config`; the model code in
:mod:`stoker.train.model` and the parallel layout in :mod:`stoker.train.parallel` import their settings from
here.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import MISSING, asdict, dataclass, replace
from pathlib import Path
from typing import Any

from stoker.errors import ConfigError

__all__ = [
    "AC_MODES", "DP_MODES", "MODEL_CONFIGS", "PRECISIONS", "SCHEDULES", "SECTIONS",
    "CheckpointSection", "DataSection", "LlamaConfig", "MetricsSection", "ModelSection", "OptimSection",
    "ParallelConfig", "StragglersSection", "TrainConfig", "TrainSection",
    "field_help", "get_model_config", "section_keys", "setting", "with_overrides",
]


def setting(default: Any = MISSING, help: str = "", *, factory: Any = MISSING) -> Any:
    """A dataclass field with its help text in ``metadata["help"]`` (read by :func:`field_help`)."""
    if not help:
        raise TypeError("every setting needs its help text")
    return dataclasses.field(default=default, default_factory=factory, metadata={"help": help})


def field_help(cls: type) -> dict[str, str]:
    """``{field name: help text}`` of a settings dataclass, in declaration order."""
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}


def _check_finite(key: str, value: float, *, low: float | None = None, open_low: bool = False) -> None:
    """A ConfigError unless ``value`` is a finite number (>= ``low``, or > it with ``open_low``)."""
    ok = isinstance(value, (int, float)) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if open_low else value >= low
    if not ok:
        bound = "" if low is None else f" {'>' if open_low else '>='} {low:g}"
        raise ConfigError(f"{key} must be a finite number{bound}, got {value!r}")


# ---------------------------------------------------------------------------------------------------- [model]
_ROPE_SCALING_KEYS = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}


@dataclass(kw_only=True)
class LlamaConfig:
    """Shape of a Llama model. ``ffn_dim`` is the explicit SwiGLU hidden size."""

    dim: int = setting(help="model (hidden) dimension D")
    n_layers: int = setting(help="number of transformer blocks")
    n_heads: int = setting(help="attention (query) heads; dim / n_heads is the head dimension and must be even")
    n_kv_heads: int = setting(help="key/value heads (grouped-query attention); must divide n_heads")
    vocab_size: int = setting(help="vocabulary size; at least the tokenizer's")
    ffn_dim: int = setting(help="SwiGLU hidden size (explicit, no multiplier)")
    norm_eps: float = setting(1e-5, "RMSNorm epsilon")
    rope_theta: float = setting(10000.0, "RoPE base frequency (10000 in Llama 2, 500000 in Llama 3)")
    rope_scaling: dict[str, Any] | None = setting(
        None, "Llama-3.1 RoPE frequency scaling {factor, low_freq_factor, high_freq_factor, "
              "original_max_position_embeddings}, or none")
    max_seq_len: int = setting(2048, "positions the model supports: the longest sequence it trains on")
    tie_embeddings: bool = setting(False, "share the token embedding and the output projection")

    def __post_init__(self) -> None:
        for name in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "ffn_dim", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"model.{name} must be a positive integer, got {value!r}")
        for name in ("norm_eps", "rope_theta"):
            _check_finite(f"model.{name}", getattr(self, name), low=0.0, open_low=True)
        if self.dim % self.n_heads:
            raise ConfigError(
                f"model.dim ({self.dim}) must be divisible by model.n_heads ({self.n_heads}); "
                "pick n_heads so that dim / n_heads is the head dimension"
            )
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"model.n_heads ({self.n_heads}) must be a multiple of model.n_kv_heads ({self.n_kv_heads}) "
                "for grouped-query attention"
            )
        if self.head_dim % 2:
            raise ConfigError(f"the head dimension dim/n_heads = {self.head_dim} must be even for RoPE")
        if self.rope_scaling is not None:
            missing = _ROPE_SCALING_KEYS - set(self.rope_scaling)
            if missing:
                raise ConfigError(
                    f"model.rope_scaling lacks {sorted(missing)}; give the Llama-3 keys {sorted(_ROPE_SCALING_KEYS)} "
                    "or set rope_scaling to None"
                )

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def num_params(self, *, include_embeddings: bool = True) -> int:
        """Parameter count computed from the shape (no model needed)."""
        d, hd = self.dim, self.head_dim
        attn = d * self.n_heads * hd * 2 + d * self.n_kv_heads * hd * 2
        ffn = 3 * d * self.ffn_dim
        per_layer = attn + ffn + 2 * d
        emb = self.vocab_size * d
        out = 0 if self.tie_embeddings else self.vocab_size * d
        total = self.n_layers * per_layer + d + out
        return total + emb if include_embeddings else total


_LLAMA3_ROPE = {"rope_theta": 500000.0, "norm_eps": 1e-5}
_LLAMA31_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192}

MODEL_CONFIGS: dict[str, LlamaConfig] = {
    # CPU tests: a few thousand parameters per layer, byte-sized vocabulary
    "tiny": LlamaConfig(
        dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256, ffn_dim=192, max_seq_len=128
    ),
    # quickstart: ~22M parameters with a Llama-2 sized vocabulary (tied embeddings)
    "small": LlamaConfig(
        dim=384, n_layers=6, n_heads=6, n_kv_heads=2, vocab_size=32000, ffn_dim=1024,
        max_seq_len=1024, tie_embeddings=True,
    ),
    "llama2-7b": LlamaConfig(
        dim=4096, n_layers=32, n_heads=32, n_kv_heads=32, vocab_size=32000, ffn_dim=11008, max_seq_len=4096
    ),
    "llama2-13b": LlamaConfig(
        dim=5120, n_layers=40, n_heads=40, n_kv_heads=40, vocab_size=32000, ffn_dim=13824, max_seq_len=4096
    ),
    "llama2-70b": LlamaConfig(
        dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, vocab_size=32000, ffn_dim=28672, max_seq_len=4096
    ),
    "llama3-8b": LlamaConfig(
        dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, vocab_size=128256, ffn_dim=14336,
        max_seq_len=8192, **_LLAMA3_ROPE,
    ),
    "llama3.1-8b": LlamaConfig(
        dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, vocab_size=128256, ffn_dim=14336,
        max_seq_len=131072, rope_scaling=dict(_LLAMA31_SCALING), **_LLAMA3_ROPE,
    ),
    # torchtitan's llama3 flavors (``--config-format torchtitan``): debugmodel, 70B and 405B (its 8B is llama3.1-8b)
    "llama3-debugmodel": LlamaConfig(
        dim=256, n_layers=6, n_heads=16, n_kv_heads=16, vocab_size=2048, ffn_dim=768, max_seq_len=131072,
        rope_scaling=dict(_LLAMA31_SCALING), **_LLAMA3_ROPE,
    ),
    "llama3.1-70b": LlamaConfig(
        dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, vocab_size=128256, ffn_dim=28672, max_seq_len=131072,
        rope_scaling=dict(_LLAMA31_SCALING), **_LLAMA3_ROPE,
    ),
    "llama3.1-405b": LlamaConfig(
        dim=16384, n_layers=126, n_heads=128, n_kv_heads=8, vocab_size=128256, ffn_dim=53248, max_seq_len=131072,
        rope_scaling=dict(_LLAMA31_SCALING), **_LLAMA3_ROPE,
    ),
    # Llama-3.2-1B shaped
    "1b": LlamaConfig(
        dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, vocab_size=128256, ffn_dim=8192,
        max_seq_len=131072, tie_embeddings=True, rope_scaling={**_LLAMA31_SCALING, "factor": 32.0},
        **_LLAMA3_ROPE,
    ),
}


def get_model_config(name: str, **overrides: Any) -> LlamaConfig:
    """A copy of the named config, with ``overrides`` (e.g. ``max_seq_len=256``) applied and validated."""
    try:
        base = MODEL_CONFIGS[name]
    except KeyError:
        raise ConfigError(
            f"unknown model config {name!r}; choose one of {sorted(MODEL_CONFIGS)} "
            "or give the shape explicitly in [model]"
        ) from None
    return with_overrides(base, **overrides)


def _check_model_keys(overrides: dict[str, Any]) -> None:
    unknown = set(overrides) - set(LlamaConfig.__dataclass_fields__)
    if unknown:
        raise ConfigError(f"unknown model settings {sorted(unknown)}; "
                          f"valid: {sorted(LlamaConfig.__dataclass_fields__)}")


def with_overrides(base: LlamaConfig, **overrides: Any) -> LlamaConfig:
    """A copy of ``base`` with ``overrides`` applied and validated."""
    _check_model_keys(overrides)
    cfg = replace(base, **overrides)
    if cfg.rope_scaling is not None:
        cfg.rope_scaling = dict(cfg.rope_scaling)
    return cfg


@dataclass(kw_only=True)
class ModelSection:
    """``[model]``: a named config plus any :class:`LlamaConfig` field to override (``max_seq_len = 256``).
    Without a name the shape is ``init_from``'s (a Hugging Face folder's config.json or a stoker
    checkpoint's manifest), else ``tiny``."""

    name: str = setting("", "a named shape (tiny, small, llama2-7b, llama3-8b, ...); empty: init_from's shape, "
                            "else tiny")
    overrides: dict[str, Any] = setting(
        factory=dict, help="LlamaConfig fields to change; in TOML give them directly in [model] (max_seq_len = 256)")
    init_from: str = setting("", "start from these weights: a Hugging Face folder or a stoker checkpoint "
                                 "(fine-tuning); ignored when the run resumes from its own checkpoint")

    def __post_init__(self) -> None:
        if not self.name and not self.init_from:
            self.name = "tiny"
        if self.name:
            self.resolve()  # validates the name and the overrides now
        else:  # the shape is init_from's, read when training starts: the overrides' names are checked now
            _check_model_keys(self.overrides)

    def resolve(self) -> LlamaConfig:
        """The named shape with the overrides. With ``init_from`` and no name the shape is the source's, which
        needs its files: :func:`stoker.train.config.resolve_model` reads them (this module does no I/O)."""
        if not self.name:
            raise ConfigError(f"model.init_from={self.init_from}: the shape is the source's; read it with "
                              "stoker.train.config.resolve_model(section), or name the model in [model]")
        return get_model_config(self.name, **self.overrides)


# ----------------------------------------------------------------------------------------------------- [data]
@dataclass(kw_only=True)
class DataSection:
    """``[data]``: ``url`` of a prepared ``stoker.data`` dataset or a flat token file (``.bin``/``.npy``)."""

    url: str = setting("", "a dataset prepared by `stoker data prepare`, or a flat token file (.bin / .npy)")
    split: str = setting("train", "the prepared dataset's split to train on")
    shuffle: bool = setting(True, "shuffle the blocks (deterministically, from train.seed)")
    block_size: int = setting(0, "token files only: tokens per sample incl. the shifted target "
                                 "(0: model.max_seq_len + 1)")
    token_dtype: str = setting("uint16", "token files (.bin) only: the integer type of the tokens")

    def __post_init__(self) -> None:
        if self.block_size < 0:
            raise ConfigError(f"data.block_size must be >= 0, got {self.block_size}")


# ---------------------------------------------------------------------------------------------------- [train]
SCHEDULES = ("cosine", "linear", "constant")
ACCELERATORS = ("auto", "cpu", "cuda", "neuron", "gpu", "trainium", "xla")  # the last three: accelerators.detect's


@dataclass(kw_only=True)
class TrainSection:
    """``[train]``: steps, batch, optimizer, schedule, clipping, seed, logging."""

    steps: int = setting(100, "optimizer steps to run in all (a resumed run continues to this step)")
    micro_batch_size: int = setting(8, "sequences per rank per forward/backward pass")
    global_batch_size: int = setting(0, "sequences per optimizer step, a multiple of micro_batch_size x dp "
                                        "(gradient accumulation makes up the rest); 0: micro_batch_size x dp")
    lr: float = setting(3e-4, "peak learning rate (AdamW)")
    min_lr: float = setting(0.0, "learning rate at the end of the schedule (<= lr)")
    warmup_steps: int = setting(0, "steps of linear warmup from 0 to lr")
    schedule: str = setting("cosine", f"decay after warmup: one of {', '.join(SCHEDULES)}")
    weight_decay: float = setting(0.1, "AdamW weight decay (not applied to norms and biases)")
    beta1: float = setting(0.9, "AdamW beta1")
    beta2: float = setting(0.95, "AdamW beta2")
    eps: float = setting(1e-8, "AdamW epsilon")
    grad_clip: float = setting(1.0, "clip the global gradient norm to this (<= 0: measure it only)")
    seed: int = setting(0, "seed of the initial weights, the data order and the random number generators")
    log_every: int = setting(10, "steps between metrics lines (metrics.jsonl, TensorBoard, progress)")
    accelerator: str = setting("auto", "auto, cpu, cuda or neuron ($STOKER_ACCELERATOR overrides auto)")
    stop_after: int = setting(0, "stop (with a checkpoint) once this step is reached; 0: run all steps")

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ConfigError(f"train.steps must be >= 1, got {self.steps}")
        if self.micro_batch_size < 1:
            raise ConfigError(f"train.micro_batch_size must be >= 1, got {self.micro_batch_size}")
        if self.global_batch_size < 0:
            raise ConfigError(f"train.global_batch_size must be >= 0, got {self.global_batch_size}")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"train.schedule={self.schedule!r}; use one of {SCHEDULES}")
        if self.lr <= 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise ConfigError(f"need 0 <= train.min_lr <= train.lr and lr > 0 (lr={self.lr}, min_lr={self.min_lr})")
        if self.stop_after < 0:
            raise ConfigError(f"train.stop_after must be >= 0, got {self.stop_after}")
        if self.warmup_steps < 0 or self.log_every < 1:
            raise ConfigError("train.warmup_steps must be >= 0 and train.log_every >= 1")
        for name in ("lr", "min_lr", "grad_clip"):
            _check_finite(f"train.{name}", getattr(self, name))
        _check_finite("train.weight_decay", self.weight_decay, low=0.0)
        _check_finite("train.eps", self.eps, low=0.0, open_low=True)
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"train.{name} must be >= 0 and < 1, got {getattr(self, name)!r}")
        if not 0 <= self.seed < 2**32:
            raise ConfigError(f"train.seed must be >= 0 and < 2**32 (numpy's range), got {self.seed}")
        if self.accelerator.lower() not in ACCELERATORS:
            raise ConfigError(f"train.accelerator={self.accelerator!r}; use one of {ACCELERATORS}")


OptimSection = TrainSection  # the class's former name, kept for code that imports it


# ------------------------------------------------------------------------------------------------- [parallel]
DP_MODES = ("zero1", "fsdp", "ddp")
AC_MODES = ("none", "full", "selective")
PRECISIONS = ("fp32", "bf16")


@dataclass(kw_only=True)
class ParallelConfig:
    """``[parallel]`` settings."""

    tp: int = setting(1, "tensor-parallel degree: divides the heads, the KV heads and the world size")
    dp: int = setting(-1, "data-parallel degree; -1: world size / tp")
    dp_mode: str = setting("zero1", "zero1 (AdamW state sharded), fsdp (FSDP2: everything sharded) or ddp "
                                    "(gradients all-reduced, state replicated)")
    sequence_parallel: bool = setting(False, "with tp > 1, also shard the norms and the residual stream along "
                                             "the sequence")
    loss_parallel: bool = setting(True, "with tp > 1, keep the output layer's logits sharded on the vocabulary and "
                                        "compute the cross entropy on the shards (torch's loss_parallel), instead of "
                                        "all-gathering the [batch, seq, vocab] logits on every TP rank; false: "
                                        "replicated logits")
    activation_checkpoint: str = setting("none", "none, full (recompute each block) or selective (keep matmul "
                                                 "and attention outputs)")
    compile: bool = setting(False, "torch.compile each transformer block")
    precision: str = setting("fp32", "compute precision: fp32 or bf16 (weights and optimizer state stay fp32)")

    def __post_init__(self) -> None:
        if self.dp_mode not in DP_MODES:
            raise ConfigError(f"parallel.dp_mode={self.dp_mode!r}; use one of {DP_MODES}")
        if self.activation_checkpoint not in AC_MODES:
            raise ConfigError(f"parallel.activation_checkpoint={self.activation_checkpoint!r}; use one of {AC_MODES}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"parallel.precision={self.precision!r}; use one of {PRECISIONS}")
        if self.tp < 1:
            raise ConfigError(f"parallel.tp must be >= 1, got {self.tp}")
        if self.dp == 0 or self.dp < -1:
            raise ConfigError(f"parallel.dp must be >= 1 or -1 (derive from the world size), got {self.dp}")


# ----------------------------------------------------------------------------------------------- [checkpoint]
@dataclass(kw_only=True)
class CheckpointSection:
    """``[checkpoint]``: where and how often; ``resume`` = ``auto`` (latest in ``dir`` if any) or ``never``."""

    dir: str = setting("", "where checkpoints go: a local path or an fsspec URL (default: <out_dir>/checkpoints)")
    every: int | str = setting(0, "steps between checkpoints (0: only at the end); auto: the interval that "
                                  "minimises the expected lost time (Young/Daly) from the measured save time and "
                                  "mtbf_hours, recomputed after every save")
    mtbf_hours: float = setting(0.0, "one node's mean time between failures in hours, for every=auto and the "
                                     "advice in `stoker goodput` (0: $STOKER_MTBF_HOURS, else 24); a job of N nodes "
                                     "fails N times as often")
    auto_first_minutes: float = setting(10.0, "every=auto: the first save comes after this much training time or "
                                              "100 steps, whichever is first; it measures the save's cost")
    keep: int = setting(3, "how many of the newest checkpoints to keep")
    async_save: bool = setting(False, "write and commit in a background thread; training only waits for the "
                                      "copy into host memory")
    save_final: bool = setting(True, "write a checkpoint at the end of training")
    resume: str = setting("auto", "auto: continue from the newest checkpoint in dir, if any; never: start afresh")
    resume_from: str = setting("", "continue from this checkpoint (a step_XXXXXXXX folder) or checkpoint dir "
                                   "(its latest)")

    def __post_init__(self) -> None:
        if self.resume not in ("auto", "never"):
            raise ConfigError(f"checkpoint.resume={self.resume!r}; use 'auto' or 'never'")
        if isinstance(self.every, str) and self.every.strip().lower() == "auto":
            self.every = "auto"
        elif isinstance(self.every, bool) or not isinstance(self.every, int):
            raise ConfigError(f"checkpoint.every={self.every!r}: give a number of steps (0: only at the end) or "
                              "'auto' (the interval that minimises the expected lost time)")
        if (self.every != "auto" and self.every < 0) or self.keep < 1:
            raise ConfigError("checkpoint.every must be >= 0 (or 'auto') and checkpoint.keep >= 1")
        _check_finite("checkpoint.mtbf_hours", self.mtbf_hours, low=0.0)
        _check_finite("checkpoint.auto_first_minutes", self.auto_first_minutes, low=0.0, open_low=True)


# -------------------------------------------------------------------------------------------------- [metrics]
@dataclass(kw_only=True)
class MetricsSection:
    """``[metrics]``: JSON lines file, TensorBoard (when installed), rich progress on rank 0."""

    path: str = setting("", "the JSON lines file (default: <out_dir>/metrics.jsonl)")
    tensorboard: bool = setting(True, "also write TensorBoard events to <out_dir>/tensorboard, when installed")
    progress: bool = setting(True, "show a progress bar on rank 0")


# ----------------------------------------------------------------------------------------------- [stragglers]
@dataclass(kw_only=True)
class StragglersSection:
    """``[stragglers]``: each rank times its steps; ranks and nodes that stay slower than the median are named
    (in the log, the metrics, `stoker show` and the UI; see :mod:`stoker.train.stragglers`)."""

    enabled: bool = setting(True, "time every rank's steps (compute, data wait, collective wait) and name the ranks "
                                  "and nodes that stay slower than the median")
    window: int = setting(0, "steps per scoring window: one small all_gather each (0: train.log_every)")
    threshold: float = setting(0.7, "a rank or node scoring below this is slow (score: the median busy time, "
                                    "compute + data wait, over its own)")
    windows: int = setting(3, "consecutive slow windows before a rank or node is named")

    def __post_init__(self) -> None:
        if self.window < 0 or self.windows < 1:
            raise ConfigError(f"stragglers.window must be >= 0 and stragglers.windows >= 1 (window={self.window}, "
                              f"windows={self.windows})")
        _check_finite("stragglers.threshold", self.threshold, low=0.0, open_low=True)
        if self.threshold > 1:
            raise ConfigError(f"stragglers.threshold must be > 0 and <= 1 (a fraction of the median), got "
                              f"{self.threshold!r}")


# ------------------------------------------------------------------------------------------------------ whole
@dataclass(kw_only=True)
class TrainConfig:
    """The whole training configuration (``stoker.train``'s TOML file)."""

    out_dir: str = setting("stoker-train", "where config.json, result.json, metrics and (by default) "
                                           "checkpoints go")
    model: ModelSection = setting(factory=ModelSection, help="[model]: the model's shape")
    data: DataSection = setting(factory=DataSection, help="[data]: what to train on")
    train: TrainSection = setting(factory=TrainSection, help="[train]: steps, batch, optimizer, schedule")
    parallel: ParallelConfig = setting(factory=ParallelConfig, help="[parallel]: TP, data parallelism, precision")
    checkpoint: CheckpointSection = setting(factory=CheckpointSection, help="[checkpoint]: where, how often, resume")
    metrics: MetricsSection = setting(factory=MetricsSection, help="[metrics]: metrics file, TensorBoard, progress")
    stragglers: StragglersSection = setting(factory=StragglersSection,
                                            help="[stragglers]: per-rank step timing, slow ranks and nodes named")

    @property
    def checkpoint_dir(self) -> str:
        return self.checkpoint.dir or str(Path(self.out_dir) / "checkpoints")

    @property
    def metrics_path(self) -> str:
        return self.metrics.path or str(Path(self.out_dir) / "metrics.jsonl")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


SECTIONS: dict[str, type] = {
    "model": ModelSection, "data": DataSection, "train": TrainSection, "parallel": ParallelConfig,
    "checkpoint": CheckpointSection, "metrics": MetricsSection, "stragglers": StragglersSection,
}


def section_keys(section: str) -> dict[str, str]:
    """The keys a TOML section accepts, with their help. ``[model]`` takes name, init_from, overrides and,
    directly, every :class:`LlamaConfig` field."""
    if section not in SECTIONS:
        raise ConfigError(f"unknown section [{section}]; valid: {', '.join(SECTIONS)}")
    keys = field_help(SECTIONS[section])
    if section == "model":
        keys.update(field_help(LlamaConfig))
    return keys


def settings_help() -> str:
    """Every setting with its default and help, section by section (``python -m stoker.train --help``)."""
    out_dir = TrainConfig.__dataclass_fields__["out_dir"]
    lines = ["Settings (TOML sections, or --set section.key=value):",
             f"  out_dir = {json.dumps(out_dir.default)}  # {out_dir.metadata['help']}"]
    for section, cls in SECTIONS.items():
        lines.append(f"  [{section}]")
        classes = [cls, LlamaConfig] if section == "model" else [cls]
        for c in classes:
            for f in dataclasses.fields(c):
                default = f.default if f.default is not MISSING else (
                    f.default_factory() if f.default_factory is not MISSING else None)
                shown = "(from name)" if c is LlamaConfig else json.dumps(default)
                lines.append(f"    {f.name} = {shown}  # {f.metadata['help']}")
    return "\n".join(lines)
