"""FLOPs and parameter counts against hand counts of published Llama shapes."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from stoker.errors import ConfigError
from stoker.train.flops import achieved_flops, flops_per_token, mfu, num_params


@dataclass
class Shape:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    ffn_dim: int
    tie_embeddings: bool = False


LLAMA2_7B = Shape(dim=4096, n_layers=32, n_heads=32, n_kv_heads=32, vocab_size=32000, ffn_dim=11008)
LLAMA3_8B = Shape(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, vocab_size=128256, ffn_dim=14336)


def test_llama2_7b_total_matches_published_count():
    # meta-llama/Llama-2-7b-hf: 6,738,415,616 parameters
    assert num_params(LLAMA2_7B, exclude_embedding=False) == 6_738_415_616
    assert num_params(LLAMA2_7B) == 6_738_415_616 - 32000 * 4096


def test_llama3_8b_total_matches_published_count():
    # meta-llama/Meta-Llama-3-8B: 8,030,261,248 parameters (GQA: 8 kv heads)
    assert num_params(LLAMA3_8B, exclude_embedding=False) == 8_030_261_248


def test_small_shape_by_hand():
    s = Shape(dim=8, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=10, ffn_dim=12)
    # per layer: wq 8*8 + wo 8*8 + wk 8*4 + wv 8*4 = 192; mlp 3*8*12 = 288; norms 16 -> 496
    body = 2 * 496 + 8
    assert num_params(s, exclude_embedding=False) == body + 2 * 80
    assert num_params(s) == body + 80
    tied = Shape(dim=8, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=10, ffn_dim=12, tie_embeddings=True)
    # tied: one shared V x D matrix, counted once either way (it is still the output matmul)
    assert num_params(tied, exclude_embedding=False) == body + 80
    assert num_params(tied) == body + 80
    # 6N + 12 L H Q T with L=2, H=2, Q=4, T=16
    assert flops_per_token(s, 16) == 6 * (body + 80) + 12 * 2 * 2 * 4 * 16


def test_llama2_7b_flops_and_mfu():
    n = 6_738_415_616 - 131_072_000
    f = flops_per_token(LLAMA2_7B, 4096)
    assert f == 6 * n + 12 * 32 * 32 * 128 * 4096
    # 3,000 tokens/s on a 989 TFLOP/s device
    assert mfu(3000, LLAMA2_7B, 4096, 989e12) == pytest.approx(3000 * f / 989e12)
    assert 0.1 < mfu(3000, LLAMA2_7B, 4096, 989e12) < 0.2
    assert achieved_flops(2.0, LLAMA2_7B, 4096) == 2.0 * f
    assert mfu(3000, LLAMA2_7B, 4096, None) is None


def test_bad_inputs_are_config_errors():
    with pytest.raises(ConfigError, match="seq_len"):
        flops_per_token(LLAMA2_7B, 0)
    with pytest.raises(ConfigError, match="peak"):
        mfu(1.0, LLAMA2_7B, 16, 0.0)
    with pytest.raises(ConfigError, match="ffn_dim"):
        num_params(object())
    with pytest.raises(ConfigError, match="multiple"):
        num_params(Shape(dim=10, n_layers=1, n_heads=3, n_kv_heads=3, vocab_size=4, ffn_dim=4))
