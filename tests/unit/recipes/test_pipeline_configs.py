"""The pipeline configs (quickstart defaults and the Llama-2-7B recipe) resolve into valid training setups."""

from __future__ import annotations

from pathlib import Path

import pytest

from stoker.errors import ConfigError
from stoker.flow.parameters import load_config_file
from stoker.recipes.llama_pretrain import DEFAULT_CONFIG, train_overrides
from stoker.train.config import load_config
from stoker.train.parallel import ParallelDims

ROOT = Path(__file__).resolve().parents[3]


def resolve(path: Path):
    raw = load_config_file(path)
    cfg = load_config(None, train_overrides(raw))
    world = raw["cluster"]["nodes"] * raw["cluster"]["nproc_per_node"]
    dims = ParallelDims(dp=cfg.parallel.dp, tp=cfg.parallel.tp, world_size=world)
    model = cfg.model.resolve()
    dims.validate_model(model, seq_len=raw["data"]["block_size"] - 1)
    return raw, cfg, dims, model


def test_quickstart_defaults_are_tp2_by_dp2_zero1():
    raw, cfg, dims, model = resolve(DEFAULT_CONFIG)
    assert (dims.dp, dims.tp, cfg.parallel.dp_mode) == (2, 2, "zero1")
    assert model.vocab_size == 32000 and raw["data"]["block_size"] - 1 <= model.max_seq_len
    assert cfg.checkpoint.every > 0, "the quickstart checkpoints during training"


def test_llama2_7b_recipe_matches_the_published_one():
    raw, cfg, dims, model = resolve(ROOT / "examples" / "configs" / "llama2_7b.toml")
    assert (dims.tp, dims.dp, dims.world_size) == (8, 16, 128)
    assert (model.dim, model.n_layers, model.n_heads, model.max_seq_len) == (4096, 32, 32, 4096)
    t = cfg.train
    assert (t.global_batch_size, t.micro_batch_size, t.lr, t.grad_clip, t.steps) == (1024, 1, 3e-4, 1.0, 10000)
    assert t.warmup_steps > 0 and cfg.parallel.precision == "bf16"
    assert t.global_batch_size % (t.micro_batch_size * dims.dp) == 0


def test_a_tp_degree_that_does_not_divide_the_heads_is_rejected():
    raw = load_config_file(DEFAULT_CONFIG)
    raw["parallel"]["tp"] = 3
    cfg = load_config(None, train_overrides(raw))
    with pytest.raises(ConfigError, match="tp=3"):
        ParallelDims(dp=-1, tp=3, world_size=6).validate_model(cfg.model.resolve())


def test_a_config_file_is_merged_over_the_defaults():
    from stoker.flow.parameters import Config
    from stoker.recipes.llama_pretrain import LlamaPretrain

    defaults = load_config_file(DEFAULT_CONFIG)
    partial = LlamaPretrain.config.parser("[train]\nsteps = 6\n")
    assert partial["train"]["steps"] == 6 and partial["train"]["lr"] == defaults["train"]["lr"]
    assert partial["data"] == defaults["data"] and partial["cluster"] == defaults["cluster"]
    assert LlamaPretrain.config.parser('{"cluster": {"nodes": 1}}')["cluster"]["nproc_per_node"] == \
        defaults["cluster"]["nproc_per_node"]
    assert isinstance(LlamaPretrain.config, Config)
    with pytest.raises(ConfigError, match="cannot be parsed.*start from a copy of"):
        LlamaPretrain.config.parser("[train\n")
