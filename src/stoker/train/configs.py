"""Named model shapes: ``get_model_config("llama2-7b")`` and friends."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from stoker.errors import ConfigError
from stoker.train.model import LlamaConfig

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
        max_seq_len=131072, rope_scaling={
            "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        }, **_LLAMA3_ROPE,
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
        max_seq_len=131072, tie_embeddings=True, rope_scaling={
            "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        }, **_LLAMA3_ROPE,
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


def with_overrides(base: LlamaConfig, **overrides: Any) -> LlamaConfig:
    """A copy of ``base`` with ``overrides`` applied and validated."""
    unknown = set(overrides) - set(LlamaConfig.__dataclass_fields__)
    if unknown:
        raise ConfigError(f"unknown model settings {sorted(unknown)}; valid: {sorted(LlamaConfig.__dataclass_fields__)}")
    cfg = replace(base, **overrides)
    if cfg.rope_scaling is not None:
        cfg.rope_scaling = dict(cfg.rope_scaling)
    return cfg
