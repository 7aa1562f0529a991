"""A misspelt training setting in the pipeline config fails before any task starts (issue 13): one line naming
the key and the nearest valid one, no retries, no traceback; the key lists are stoker.train's settings' fields
(stoker.train.settings, torch-free), and so are the checks of the values."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time

import pytest

from stoker.errors import ConfigError
from stoker.flow.parameters import load_config_file
from stoker.recipes.llama_pretrain import (
    DEFAULT_CONFIG,
    LlamaPretrain,
    check_pipeline_values,
    check_train_plan,
    check_train_settings,
    check_train_values,
    valid_settings,
)
from stoker.train.settings import CheckpointSection, LlamaConfig, ModelSection, ParallelConfig, TrainSection
from tests.helpers import EXAMPLES, ROOT


def test_the_key_lists_are_stoker_trains_dataclass_fields():
    def names(*classes):
        return {f.name for cls in classes for f in dataclasses.fields(cls)}

    assert valid_settings() == {"model": names(ModelSection, LlamaConfig), "train": names(TrainSection),
                                "parallel": names(ParallelConfig), "checkpoint": names(CheckpointSection)}


@pytest.mark.parametrize("section, key, value, message", [
    ("train", "schedule", "cosin", "train.schedule='cosin'; use one of ('cosine', 'linear', 'constant')"),
    ("train", "steps", "ten", "train.steps='ten': expected an integer (in the pipeline config)"),
    ("parallel", "dp_mode", "zero3", "parallel.dp_mode='zero3'; use one of ('zero1', 'fsdp', 'ddp')"),
    ("model", "name", "llama9", "unknown model config 'llama9'"),
])
def test_a_bad_value_fails_with_stoker_trains_message(section, key, value, message):
    cfg = load_config_file(DEFAULT_CONFIG)
    cfg[section][key] = value
    with pytest.raises(ConfigError) as e:
        check_train_values(cfg)
    assert message in str(e.value)


def test_a_fine_tuned_model_is_checked_when_its_shape_is_known():
    cfg = load_config_file(DEFAULT_CONFIG)
    cfg["model"] = {"init_from": "s3://bucket/Llama-2-7b-hf"}  # its shape is read when training starts
    check_train_values(cfg)
    check_train_plan(cfg)


def test_shipped_configs_pass():
    check_train_settings(load_config_file(DEFAULT_CONFIG))
    check_train_settings(load_config_file(EXAMPLES / "configs" / "llama2_7b.toml"))


def test_a_misspelt_key_names_the_nearest_one():
    cfg = load_config_file(DEFAULT_CONFIG)
    cfg["parallel"]["dp_mod"] = "fsdp"
    with pytest.raises(ConfigError, match=r"the --config file: parallel.dp_mod is not a setting; did you mean "
                                          r"parallel.dp_mode\?"):
        check_train_settings(cfg)


def test_set_train_stepz_fails_before_any_task_starts(tmp_path):
    t0 = time.time()
    p = subprocess.run([sys.executable, str(EXAMPLES / "llama_pretrain.py"), "run", "--set", "train.stepz=5"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       env={**__import__("os").environ, "PYTHONPATH": str(ROOT / "src")})
    out = p.stdout + p.stderr
    assert p.returncode == 1 and time.time() - t0 < 10, out
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert lines == ["error: --set train.stepz: train.stepz is not a setting; did you mean train.steps? (valid in "
                     "[train]: " + ", ".join(sorted(valid_settings()["train"])) + ")"], out
    assert "retry" not in out and "Traceback" not in out and "started" not in out


@pytest.mark.parametrize("key, value, message", [
    ("cluster.nodes", -1, "cluster.nodes=-1 is out of range: it must be a whole number >= 1"),
    ("cluster.nproc_per_node", 0, "cluster.nproc_per_node=0 is out of range"),  # 0 is not "auto" here
    ("cluster.nodes", "two", "cluster.nodes='two' is out of range"),
    ("data.val_fraction", 0.0, "the evaluate step needs a validation split"),
    ("data.block_size", 1, "data.block_size=1 is out of range: it must be a whole number >= 2"),
    ("evaluate.batches", 0, "evaluate.batches=0 is out of range"),
    ("evaluate.temperature", float("inf"), "a finite number >= 0"),
    ("evaluate.prompts", "ROMEO:", "a list of strings"),
    ("evaluate.batch", 8, "evaluate.batch is not a setting; did you mean evaluate.batches?"),
])
def test_the_pipelines_own_settings_are_range_checked_when_the_run_starts(key, value, message):
    with pytest.raises(ConfigError) as e:
        LlamaPretrain.config.resolve(None, {key: value})
    assert message in str(e.value) and f"--set {key}" in str(e.value)


def test_shipped_configs_pass_the_pipeline_checks():
    check_pipeline_values(load_config_file(DEFAULT_CONFIG))
    check_pipeline_values(LlamaPretrain.config.parser((EXAMPLES / "configs" / "llama2_7b.toml").read_text()))
