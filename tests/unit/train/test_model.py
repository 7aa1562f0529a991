"""The Llama model: shapes, configs, validation and logits parity with transformers."""

from __future__ import annotations

import pytest
import torch

from stoker.errors import ConfigError
from stoker.train.model import Llama, LlamaConfig
from stoker.train.settings import MODEL_CONFIGS, get_model_config

torch.set_num_threads(1)


def _hf_model(cfg: LlamaConfig, model: Llama):
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.ffn_dim,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
        rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta, max_position_embeddings=cfg.max_seq_len,
        tie_word_embeddings=cfg.tie_embeddings, attention_bias=False, mlp_bias=False,
        rope_scaling=None if cfg.rope_scaling is None else {"rope_type": "llama3", **cfg.rope_scaling},
    )
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    names = {"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
    sub = {"attention_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
           "attention.wq": "self_attn.q_proj", "attention.wk": "self_attn.k_proj", "attention.wv": "self_attn.v_proj",
           "attention.wo": "self_attn.o_proj", "feed_forward.w1": "mlp.gate_proj", "feed_forward.w3": "mlp.up_proj",
           "feed_forward.w2": "mlp.down_proj"}
    hf_sd = {}
    for k, v in model.state_dict().items():
        if k in names:
            hf_sd[names[k]] = v
        else:
            _, i, rest = k.split(".", 2)
            mod = rest.rsplit(".", 1)[0]
            hf_sd[f"model.layers.{i}.{sub[mod]}.weight"] = v
    missing, unexpected = hf.load_state_dict(hf_sd, strict=False)
    assert not unexpected and all("rotary" in m or (cfg.tie_embeddings and m == "lm_head.weight") for m in missing)
    return hf


@pytest.mark.parametrize("overrides", [
    {},
    {"tie_embeddings": True, "rope_theta": 500000.0, "rope_scaling": {
        "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32}},
])
def test_logits_match_transformers(overrides):
    cfg = get_model_config("tiny", **overrides)
    model = Llama(cfg)
    model.init_weights(seed=3)
    hf = _hf_model(cfg, model)
    tokens = torch.randint(0, cfg.vocab_size, (2, 100), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(tokens)
        theirs = hf(tokens).logits
    assert ours.shape == (2, 100, cfg.vocab_size)
    torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=1e-4)


def test_module_names_and_tied_weights():
    model = Llama(get_model_config("tiny", tie_embeddings=True))
    names = {n for n, _ in model.named_parameters()}
    assert "layers.1.feed_forward.w3.weight" in names and "layers.0.attention.wk.weight" in names
    assert model.output.weight is model.tok_embeddings.weight
    assert "rope_cos" not in model.state_dict()
    assert model.num_params() == model.cfg.num_params()


def test_init_is_deterministic():
    a, b = Llama(get_model_config("tiny")), Llama(get_model_config("tiny"))
    a.init_weights(seed=7)
    b.init_weights(seed=7)
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(p, q), n
    b.init_weights(seed=8)
    assert not torch.equal(a.output.weight, b.output.weight)


def test_named_configs_param_counts():
    assert abs(MODEL_CONFIGS["llama2-7b"].num_params() / 1e9 - 6.74) < 0.01
    assert abs(MODEL_CONFIGS["llama3-8b"].num_params() / 1e9 - 8.03) < 0.01
    assert abs(MODEL_CONFIGS["1b"].num_params() / 1e9 - 1.24) < 0.01
    assert 20e6 < MODEL_CONFIGS["small"].num_params() < 30e6


def test_bad_configs():
    with pytest.raises(ConfigError, match="n_kv_heads"):
        LlamaConfig(dim=64, n_layers=1, n_heads=4, n_kv_heads=3, vocab_size=10, ffn_dim=8)
    with pytest.raises(ConfigError, match="divisible by model.n_heads"):
        LlamaConfig(dim=66, n_layers=1, n_heads=4, n_kv_heads=4, vocab_size=10, ffn_dim=8)
    with pytest.raises(ConfigError, match="unknown model config"):
        get_model_config("llama9")
    with pytest.raises(ConfigError, match="rope_scaling"):
        get_model_config("tiny", rope_scaling={"factor": 2.0})


def test_sequence_longer_than_model_is_an_error():
    model = Llama(get_model_config("tiny", max_seq_len=16))
    with pytest.raises(ConfigError, match="max_seq_len 16"):
        model(torch.zeros(1, 17, dtype=torch.long))
