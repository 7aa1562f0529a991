"""Hugging Face parity, export and import, against the real ``transformers`` package."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import transformers
from safetensors import safe_open

from stoker.errors import CheckpointError, ConfigError
from stoker.train.hf import (
    export_hf,
    from_hf_config,
    load_hf,
    load_hf_into,
    to_hf_config,
    to_hf_state_dict,
)
from stoker.train.model import Llama, LlamaConfig

LLAMA3_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 16}
CASES = {
    # grouped-query attention, untied
    "gqa": LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=128, ffn_dim=96, max_seq_len=64),
    # tied embeddings, multi-head attention
    "tied": LlamaConfig(dim=48, n_layers=2, n_heads=3, n_kv_heads=3, vocab_size=96, ffn_dim=80, max_seq_len=64,
                        tie_embeddings=True, norm_eps=1e-6),
    # Llama-3 RoPE scaling (short original context so that scaling acts within 48 tokens)
    "llama3": LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=1, vocab_size=128, ffn_dim=128, max_seq_len=64,
                          rope_theta=500000.0, rope_scaling=LLAMA3_SCALING),
}


def _stoker(cfg: LlamaConfig, seed: int = 0) -> Llama:
    torch.manual_seed(seed)
    model = Llama(cfg)
    model.init_weights(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # away from 1, so that a norm mapped wrongly shows up
                p.uniform_(0.5, 1.5)
            if ".wq." in name or ".wk." in name:  # sharp attention, so that RoPE errors show up
                p.mul_(10.0)
    return model.eval()


def _hf_from_stoker(model: Llama, cfg: LlamaConfig) -> transformers.LlamaForCausalLM:
    hf = transformers.LlamaForCausalLM(to_hf_config(cfg, attn_implementation="eager")).eval()
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(model.state_dict(), cfg), strict=False)
    assert not unexpected
    assert missing == ([] if not cfg.tie_embeddings else ["lm_head.weight"]) or set(missing) <= {"lm_head.weight"}
    if cfg.tie_embeddings:
        hf.tie_weights()
        assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    return hf


def _tokens(cfg: LlamaConfig, t: int = 48) -> torch.Tensor:
    return torch.randint(0, cfg.vocab_size, (2, t), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers_fp32(case):
    cfg = CASES[case]
    model = _stoker(cfg)
    hf = _hf_from_stoker(model, cfg)
    x = _tokens(cfg)
    with torch.no_grad():
        ours, theirs = model(x), hf(x).logits
    assert ours.shape == theirs.shape == (2, 48, cfg.vocab_size)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=2e-5)


def test_rope_scaling_changes_logits_so_the_parity_case_is_meaningful():
    cfg = CASES["llama3"]
    x = _tokens(cfg)
    with torch.no_grad():
        scaled = _stoker(cfg)(x)
        plain = _stoker(replace(cfg, rope_scaling=None))(x)
    assert (scaled - plain).abs().max() > 100 * 2e-5  # 100x the parity tolerance


def test_loss_and_gradients_match_transformers():
    cfg = CASES["gqa"]
    model = _stoker(cfg).train()
    hf = _hf_from_stoker(model, cfg).train()
    x = _tokens(cfg, 33)
    ours = torch.nn.functional.cross_entropy(model(x)[:, :-1].flatten(0, 1), x[:, 1:].flatten())
    ours.backward()
    theirs = hf(x, labels=x).loss  # HF shifts the labels itself
    theirs.backward()
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model.layers["1"].attention.wk.weight.grad,
                               hf.model.layers[1].self_attn.k_proj.weight.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(model.layers["0"].feed_forward.w1.weight.grad,
                               hf.model.layers[0].mlp.gate_proj.weight.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("case", sorted(CASES))
def test_export_round_trip_through_transformers(case, tmp_path):
    cfg = CASES[case]
    model = _stoker(cfg)
    out = export_hf(model, cfg, tmp_path / "hf", dtype=torch.float32)
    assert out == tmp_path / "hf"
    assert {"config.json", "generation_config.json", "model.safetensors"} <= {p.name for p in out.iterdir()}
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert ("lm_head.weight" in keys) == (not cfg.tie_embeddings)
    assert not any("rope" in k for k in keys)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), attn_implementation="eager").eval()
    assert isinstance(hf, transformers.LlamaForCausalLM)
    assert hf.dtype == torch.float32
    x = _tokens(cfg)
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, model(x), rtol=1e-5, atol=2e-5)
    # and back into stoker: same config, same logits
    cfg2, sd = load_hf(out)
    assert cfg2 == cfg
    back = Llama(cfg2)
    back.load_state_dict(sd, strict=True)
    with torch.no_grad():
        torch.testing.assert_close(back.eval()(x), model(x), rtol=0, atol=0)


def test_bf16_sharded_export_with_tokenizer(tmp_path):
    cfg = CASES["gqa"]
    model = _stoker(cfg)
    from stoker.data.tokenizer import load_tokenizer, resolve_tokenizer_path

    tok, _ = resolve_tokenizer_path("llama")  # mistral-common's tokenizer.model.v1
    out = export_hf(model, cfg, tmp_path / "hf", tokenizer=tok, bos_token_id=5, eos_token_id=6,
                    max_shard_bytes=40_000)  # default dtype bf16; small shards -> several files + index
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert not (out / "model.safetensors").exists()
    assert (out / "tokenizer.model").read_bytes() == tok.read_bytes()  # under the name transformers expects
    text = "Now is the winter of our discontent\n  Made glorious summer"
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(out))  # from tokenizer.json: no protobuf needed
    assert hf_tok(text)["input_ids"] == [1, *load_tokenizer("llama").sp.encode(text)]
    assert hf_tok.decode(hf_tok(text)["input_ids"], skip_special_tokens=True) == text
    conf = json.loads((out / "config.json").read_text())
    assert conf["bos_token_id"] == 5 and conf["eos_token_id"] == 6
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 6
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out))
    assert hf.dtype == torch.bfloat16
    want = model.layers["1"].feed_forward.w2.weight.detach().to(torch.bfloat16)
    assert torch.equal(hf.model.layers[1].mlp.down_proj.weight, want)
    cfg2, sd = load_hf(out, dtype=torch.float32)
    assert cfg2 == cfg and sd["layers.1.feed_forward.w2.weight"].dtype == torch.float32


@pytest.mark.parametrize("case", ["tied", "llama3"])
def test_import_a_folder_written_by_transformers(case, tmp_path):
    cfg = CASES[case]
    torch.manual_seed(3)
    hf = transformers.LlamaForCausalLM(to_hf_config(cfg, attn_implementation="eager")).eval()
    hf.save_pretrained(str(tmp_path / "hf"))
    model = Llama(cfg)
    load_hf_into(model, tmp_path / "hf")
    if cfg.tie_embeddings:
        assert model.output.weight.data_ptr() == model.tok_embeddings.weight.data_ptr()
    x = _tokens(cfg)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), hf(x).logits, rtol=1e-5, atol=2e-5)


def test_transformers4_style_config_is_read():
    conf = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 128, "intermediate_size": 96, "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0, "max_position_embeddings": 8192, "tie_word_embeddings": False,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    cfg = from_hf_config(conf)
    assert (cfg.dim, cfg.n_kv_heads, cfg.rope_theta, cfg.max_seq_len) == (64, 2, 500000.0, 8192)
    assert cfg.rope_scaling["factor"] == 8.0
    assert from_hf_config({**conf, "rope_scaling": None}).rope_scaling is None


def test_bad_inputs(tmp_path):
    with pytest.raises(CheckpointError, match="config.json not found"):
        load_hf(tmp_path)
    base = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 8,
            "intermediate_size": 8}
    with pytest.raises(ConfigError, match="yarn"):
        from_hf_config({**base, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}})
    with pytest.raises(ConfigError, match="Llama models only"):
        from_hf_config({**base, "model_type": "mistral"})
    with pytest.raises(ConfigError, match="mlp_bias"):
        from_hf_config({**base, "mlp_bias": True})
    (tmp_path / "config.json").write_text(json.dumps(base))
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_hf(tmp_path)
    cfg = CASES["gqa"]
    sd = _stoker(cfg).state_dict()
    del sd["layers.1.attention.wv.weight"]
    with pytest.raises(CheckpointError, match="missing"):
        export_hf(sd, cfg, tmp_path / "out")
    with pytest.raises(CheckpointError, match="unexpected parameter"):
        export_hf({**sd, "layers.0.attention.bias": torch.zeros(1)}, cfg, tmp_path / "out")
    with pytest.raises(ConfigError, match="tokenizer"):
        export_hf(_stoker(cfg), cfg, tmp_path / "out2", tokenizer=tmp_path / "nope.model")
    assert not (tmp_path / "out2").exists()  # checked before anything is written


def test_every_named_config_round_trips_through_the_hf_config():
    from stoker.train.settings import MODEL_CONFIGS

    for name, cfg in MODEL_CONFIGS.items():
        hf = to_hf_config(cfg)
        assert from_hf_config(hf) == cfg, name
        assert from_hf_config(json.loads(hf.to_json_string())) == cfg, name
    hf = to_hf_config(MODEL_CONFIGS["llama3.1-8b"]).to_dict()
    rope = hf.get("rope_parameters") or hf["rope_scaling"]
    assert rope["rope_type"] == "llama3" and rope["factor"] == 8.0
    assert hf["num_key_value_heads"] == 8 and hf["intermediate_size"] == 14336
