"""Parameter counts, training FLOPs per token and model FLOPs utilisation (MFU).

The FLOPs model is the one of the PaLM paper (appendix B) that torchtitan and Megatron report:

    flops_per_token = 6 * N + 12 * L * H * Q * T

where ``N`` counts the parameters that take part in a matrix multiply for every token (all of them but the
embedding lookup table; the output projection is counted even when it shares its weight with the
embedding), ``L`` is the number of layers, ``H`` the number of attention heads, ``Q`` the head dimension and
``T`` the sequence length. ``6 N`` is forward (2) plus backward (4) for the weight matmuls; ``12 L H Q T``
is the same for the attention score and value matmuls (``QK^T`` and ``AV``). Activation recomputation is
*not* counted: MFU measures useful work, so recomputation lowers it.

These functions read only a config's shape attributes (``dim, n_layers, n_heads, n_kv_heads, vocab_size,
ffn_dim, tie_embeddings``), so they work for any object carrying them and never build a model.
"""

from __future__ import annotations

import logging
from typing import Any

from stoker.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = ["num_params", "flops_per_token", "achieved_flops", "mfu"]


def _shape(cfg: Any) -> tuple[int, int, int, int, int, int, int, bool]:
    try:
        dim, n_layers, n_heads = int(cfg.dim), int(cfg.n_layers), int(cfg.n_heads)
        n_kv = getattr(cfg, "n_kv_heads", None)
        n_kv_heads = int(n_kv) if n_kv is not None else n_heads
        vocab, ffn = int(cfg.vocab_size), int(cfg.ffn_dim)
        tied = bool(getattr(cfg, "tie_embeddings", False))
    except AttributeError as e:
        raise ConfigError(
            f"flops: the model config lacks {e.name!r}; pass a stoker.train LlamaConfig "
            "(dim, n_layers, n_heads, n_kv_heads, vocab_size, ffn_dim, tie_embeddings)"
        ) from e
    if n_heads <= 0 or dim % n_heads:
        raise ConfigError(f"flops: dim={dim} is not a multiple of n_heads={n_heads}; fix the model config")
    return dim, n_layers, n_heads, n_kv_heads, dim // n_heads, vocab, ffn, tied


def num_params(cfg: Any, exclude_embedding: bool = True) -> int:
    """Number of parameters of a Llama model with config ``cfg``, counted from its shape.

    Per layer: ``wq (D x H*Q) + wk, wv (D x KV*Q each) + wo (H*Q x D) + w1, w3 (D x F each) + w2 (F x D)``
    and two RMSNorm weights (``D`` each); then the final norm (``D``), the embedding (``V x D``) and the
    output projection (``V x D``, absent when ``tie_embeddings``).

    With ``exclude_embedding=True`` the embedding lookup table is left out, but a tied output projection
    still counts once (its matmul runs for every token); this is the ``N`` of :func:`flops_per_token`.
    """
    dim, n_layers, n_heads, n_kv_heads, head_dim, vocab, ffn, tied = _shape(cfg)
    attn = dim * n_heads * head_dim * 2 + dim * n_kv_heads * head_dim * 2  # wq, wo + wk, wv
    mlp = 3 * dim * ffn  # w1 (gate), w3 (up), w2 (down)
    per_layer = attn + mlp + 2 * dim  # + attention_norm, ffn_norm
    body = n_layers * per_layer + dim  # + final norm
    emb = vocab * dim
    if tied:
        # one shared (V x D) matrix: as the output projection it does a matmul for every token
        return body + emb
    return body + emb + (0 if exclude_embedding else emb)


def flops_per_token(cfg: Any, seq_len: int) -> int:
    """Training FLOPs (forward + backward) per token: ``6 N + 12 L H Q T`` (see the module docstring)."""
    if seq_len <= 0:
        raise ConfigError(f"flops: seq_len must be positive, got {seq_len}")
    _, n_layers, n_heads, _, head_dim, _, _, _ = _shape(cfg)
    return 6 * num_params(cfg, exclude_embedding=True) + 12 * n_layers * n_heads * head_dim * int(seq_len)


def achieved_flops(tokens_per_s: float, cfg: Any, seq_len: int) -> float:
    """Model FLOP/s achieved at a throughput of ``tokens_per_s`` (what a CPU run reports instead of MFU)."""
    return float(tokens_per_s) * flops_per_token(cfg, seq_len)


def mfu(tokens_per_s: float, cfg: Any, seq_len: int, peak: float | None) -> float | None:
    """Model FLOPs utilisation in [0, 1]: achieved model FLOP/s over ``peak`` FLOP/s.

    ``tokens_per_s`` and ``peak`` must cover the same devices (per device, or both summed over the job).
    Returns ``None`` when ``peak`` is ``None`` (an accelerator without a known peak, such as a CPU).
    """
    if peak is None:
        return None
    if peak <= 0:
        raise ConfigError(f"mfu: peak FLOP/s must be positive, got {peak}")
    return achieved_flops(tokens_per_s, cfg, seq_len) / float(peak)
