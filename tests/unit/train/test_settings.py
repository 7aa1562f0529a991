"""stoker.train's settings live in one torch-free module (issue 24): every section is a dataclass with help on
each field and its checks; the trainer, the model, the parallel layout, the recipe and the pre-submit checks
read the same definitions, and the names users import from the older modules still work."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from stoker.errors import ConfigError
from stoker.train import settings
from stoker.train.settings import (
    MODEL_CONFIGS,
    SECTIONS,
    LlamaConfig,
    ParallelConfig,
    TrainConfig,
    TrainSection,
    field_help,
    section_keys,
    settings_help,
)
from tests.helpers import ROOT

TORCH_FREE = """
import sys
from stoker.flow.parameters import load_config_file
from stoker.recipes.llama_pretrain import (DEFAULT_CONFIG, check_train_plan, check_train_settings,
                                           check_train_values, model_shape, valid_settings)
from stoker.train.config import OptimSection, load_config
from stoker.train.configs import MODEL_CONFIGS, get_model_config
from stoker.train.plan import stoker_train_plan
from stoker.train.settings import ParallelConfig, TrainConfig, settings_help

cfg = load_config_file(DEFAULT_CONFIG)
check_train_settings(cfg); check_train_values(cfg); check_train_plan(cfg)
assert valid_settings()["train"] and model_shape({"name": "llama3-8b"})["n_kv_heads"] == 8
assert stoker_train_plan({"model": {"name": "llama2-7b"}, "parallel": {"tp": 8}}).heads == 32
assert load_config(None, ["model=small", "tp=2"]).model.resolve().dim == 384
assert get_model_config("1b").num_params() > 1e9 and settings_help()
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""


def test_the_settings_the_checks_and_the_loader_import_no_torch():
    p = subprocess.run([sys.executable, "-c", TORCH_FREE], capture_output=True, text=True, timeout=120,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"})
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]", f"torch was imported: {p.stdout}"


def test_every_field_of_every_section_has_help():
    for cls in (*SECTIONS.values(), LlamaConfig, TrainConfig):
        for f in dataclasses.fields(cls):
            assert len(f.metadata.get("help", "")) > 10, f"{cls.__name__}.{f.name}"
    with pytest.raises(TypeError, match="help"):
        settings.setting(1)


def test_the_sections_are_trainconfigs_fields():
    factories = {f.name: f.default_factory for f in dataclasses.fields(TrainConfig) if f.name != "out_dir"}
    assert factories == SECTIONS
    assert set(section_keys("model")) == {"name", "init_from", "overrides"} | set(field_help(LlamaConfig))
    assert set(section_keys("train")) == {f.name for f in dataclasses.fields(TrainSection)}
    with pytest.raises(ConfigError, match="unknown section"):
        section_keys("optim")


def test_older_import_paths_give_the_same_objects():
    from stoker.train import config, configs

    assert config.OptimSection is config.TrainSection is TrainSection
    assert config.ParallelConfig is ParallelConfig and config.TrainConfig is TrainConfig
    assert configs.get_model_config is settings.get_model_config and configs.MODEL_CONFIGS is MODEL_CONFIGS
    assert configs.with_overrides is settings.with_overrides and configs.LlamaConfig is LlamaConfig
    pytest.importorskip("torch")
    from stoker.train import model, parallel

    assert model.LlamaConfig is LlamaConfig and parallel.ParallelConfig is ParallelConfig
    assert parallel.DP_MODES is settings.DP_MODES


@pytest.mark.parametrize("make, message", [
    (lambda: TrainSection(steps=0), "train.steps must be >= 1, got 0"),
    (lambda: TrainSection(schedule="cosin"), "train.schedule='cosin'; use one of ('cosine', 'linear', 'constant')"),
    (lambda: ParallelConfig(dp_mode="zero3"), "parallel.dp_mode='zero3'; use one of ('zero1', 'fsdp', 'ddp')"),
    (lambda: settings.get_model_config("tiny", n_heads=3), "model.dim (64) must be divisible by model.n_heads (3)"),
    (lambda: settings.CheckpointSection(resume="yes"), "checkpoint.resume='yes'; use 'auto' or 'never'"),
    (lambda: settings.DataSection(block_size=-1), "data.block_size must be >= 0, got -1"),
])
def test_each_section_checks_itself(make, message):
    with pytest.raises(ConfigError) as e:
        make()
    assert message in str(e.value)


def test_help_lists_every_setting():
    text = settings_help()
    for section in SECTIONS:
        assert f"  [{section}]" in text
        for key in section_keys(section):
            assert f"    {key} = " in text, key
    assert '    dp_mode = "zero1"  # ' in text and "    steps = 100  # " in text
    p = subprocess.run([sys.executable, "-m", "stoker.train", "--help"], capture_output=True, text=True,
                       timeout=60, env=os.environ)
    assert p.returncode == 0 and "    grad_clip = 1.0  # " in p.stdout, p.stderr


def test_a_model_from_init_from_is_read_by_the_loader_not_by_the_settings(tmp_path):
    from stoker.train.config import resolve_model
    from stoker.train.settings import ModelSection

    section = ModelSection(init_from=str(tmp_path / "nowhere"), overrides={"max_seq_len": 64})  # no I/O here
    with pytest.raises(ConfigError, match="unknown model settings"):
        ModelSection(init_from="x", overrides={"dims": 64})
    with pytest.raises(ConfigError, match="resolve_model"):
        section.resolve()
    with pytest.raises(ConfigError, match="init_from=.*nowhere.*give a Hugging Face folder"):
        resolve_model(section)
    assert resolve_model(ModelSection(name="tiny", init_from="x")).dim == 64
