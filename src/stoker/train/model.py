"""The Llama model (Llama 2 / 3 / 3.x): RMSNorm, RoPE (incl. Llama-3 scaling), SwiGLU, GQA.

Module names follow torchtitan (``tok_embeddings``, ``layers.{i}.attention.wq`` ...), RoPE uses the
rotate-half (Hugging Face / GPT-NeoX) convention so Hugging Face weights map one to one without a
permutation. The model holds no parallelism: :func:`stoker.train.parallel.parallelize` applies tensor
parallel, FSDP2, activation checkpointing and ``torch.compile`` afterwards. Attention reads the number
of heads from the projection's output (``view(..., -1, head_dim)``) so a column-sharded ``wq`` just
yields fewer local heads. The shape, :class:`LlamaConfig`, is a setting: it is defined (torch-free, with the
named shapes) in :mod:`stoker.train.settings` and re-exported here.

Shape legend: B batch, T sequence, D model dim, H query heads, K kv heads, Hd head dim, F ffn dim,
V vocabulary.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from stoker.errors import ConfigError
from stoker.train.settings import LlamaConfig  # the shape is a setting, defined torch-free there

__all__ = ["Attention", "FeedForward", "Llama", "LlamaConfig", "RMSNorm", "TransformerBlock", "apply_rope",
           "rope_cos_sin", "rope_inv_freq"]


def rope_inv_freq(cfg: LlamaConfig) -> torch.Tensor:
    """Inverse frequencies [Hd/2], with the Llama-3 wavelength-dependent scaling when configured."""
    hd = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    if cfg.rope_scaling is None:
        return inv_freq.float()
    rs = cfg.rope_scaling
    factor = float(rs["factor"])
    low, high = float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
    old_len = float(rs["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    # long wavelengths are slowed down by `factor`, short ones kept, the band between interpolated
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, smoothed, scaled).float()


def rope_cos_sin(cfg: LlamaConfig, device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables [max_seq_len, Hd] in the rotate-half layout (frequencies repeated twice)."""
    inv_freq = rope_inv_freq(cfg).to(device)  # [Hd/2]
    t = torch.arange(cfg.max_seq_len, dtype=torch.float32, device=device)  # [T_max]
    freqs = torch.outer(t, inv_freq)  # [T_max, Hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [T_max, Hd]
    return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, heads, Hd]; cos/sin [T, Hd]."""
    cos = cos[None, :, None, :].to(x.dtype)  # [1, T, 1, Hd]
    sin = sin[None, :, None, :].to(x.dtype)
    return x * cos + _rotate_half(x) * sin


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in fp32 (as in Llama and HF) and cast back."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


class Attention(nn.Module):
    """Causal grouped-query attention with RoPE."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        self.n_rep = cfg.n_heads // cfg.n_kv_heads  # query heads per kv head (unchanged by TP)
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        bsz, seqlen, _ = x.shape  # x [B, T, D]
        q = self.wq(x).view(bsz, seqlen, -1, self.head_dim)  # [B, T, H, Hd] (H local under TP)
        k = self.wk(x).view(bsz, seqlen, -1, self.head_dim)  # [B, T, K, Hd]
        v = self.wv(x).view(bsz, seqlen, -1, self.head_dim)  # [B, T, K, Hd]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, heads, T, Hd]
        if self.n_rep > 1:
            k = k.repeat_interleave(self.n_rep, dim=1)  # [B, H, T, Hd]
            v = v.repeat_interleave(self.n_rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, T, Hd]
        out = out.transpose(1, 2).reshape(bsz, seqlen, -1)  # [B, T, H*Hd]
        return self.wo(out)  # [B, T, D]


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x); w1 = gate, w3 = up, w2 = down."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))  # [B, T, F] -> [B, T, D]


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then + ffn(norm(.))."""

    def __init__(self, layer_id: int, cfg: LlamaConfig) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg.dim, cfg.ffn_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)  # [B, T, D]
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    """Decoder-only Llama. ``forward(tokens [B, T]) -> logits [B, T, V]`` (in the compute dtype)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(i, cfg) for i in range(cfg.n_layers)})
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        cos, sin = rope_cos_sin(cfg, device=self.tok_embeddings.weight.device)
        # not persistent: recomputed from the config, never part of a checkpoint or an HF export
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seqlen = tokens.shape[1]  # tokens [B, T]
        if seqlen > self.cfg.max_seq_len:
            raise ConfigError(
                f"sequence length {seqlen} exceeds the model's max_seq_len {self.cfg.max_seq_len}; "
                "use shorter blocks (data block_size) or a config with a larger max_seq_len"
            )
        cos, sin = self.rope_cos[:seqlen], self.rope_sin[:seqlen]  # [T, Hd]
        h = self.tok_embeddings(tokens)  # [B, T, D]
        for layer in self.layers.values():
            h = layer(h, cos, sin)
        h = self.norm(h)
        return self.output(h)  # [B, T, V]

    @torch.no_grad()
    def init_weights(self, seed: int | None = None, *, buffer_device: torch.device | str | None = None) -> None:
        """Initialize all weights deterministically from ``seed`` (also re-creates the RoPE tables).

        As in torchtitan: embeddings N(0, 1) (0.02 when tied to the output), linear layers N(0, 0.02)
        truncated at 3 sigma, the residual branches' output projections (wo, w2) scaled by
        1/sqrt(2 * n_layers), the output layer N(0, 1/sqrt(D)). Values are drawn on the CPU from one
        generator, so the result is the same on every device and for every parallel layout (a
        parameter that is already a DTensor receives its shard of the same full tensor).
        """
        gen = None
        if seed is not None:
            gen = torch.Generator(device="cpu").manual_seed(seed)
        std = 0.02
        depth_std = std / math.sqrt(2 * self.cfg.n_layers)

        def normal_(p: torch.Tensor, s: float) -> None:
            values = torch.empty(p.shape, dtype=torch.float32).normal_(0.0, s, generator=gen)
            values.clamp_(-3 * s, 3 * s)
            if isinstance(p, DTensor):
                # every rank drew the same full tensor: each keeps its shard, no communication
                values = distribute_tensor(values, p.device_mesh, p.placements, src_data_rank=None)
            p.copy_(values.to(device=p.device, dtype=p.dtype))

        normal_(self.tok_embeddings.weight, 1.0 if not self.cfg.tie_embeddings else std)
        for layer in self.layers.values():
            for lin in (layer.attention.wq, layer.attention.wk, layer.attention.wv):
                normal_(lin.weight, std)
            normal_(layer.attention.wo.weight, depth_std)
            normal_(layer.feed_forward.w1.weight, std)
            normal_(layer.feed_forward.w3.weight, std)
            normal_(layer.feed_forward.w2.weight, depth_std)
            layer.attention_norm.reset_parameters()
            layer.ffn_norm.reset_parameters()
        self.norm.reset_parameters()
        if not self.cfg.tie_embeddings:
            normal_(self.output.weight, self.cfg.dim**-0.5)
        device = buffer_device if buffer_device is not None else self.rope_cos.device
        if str(device) == "meta":
            device = "cpu"
        cos, sin = rope_cos_sin(self.cfg, device=device)
        self.rope_cos, self.rope_sin = cos, sin

    def num_params(self) -> int:
        """Number of distinct parameters (a tied embedding counts once)."""
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())
