"""A misspelt training setting in the pipeline config fails before any task starts (issue 13): one line naming
the key and the nearest valid one, no retries, no traceback; the torch-free key lists match stoker.train's."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time

import pytest

from stoker.errors import ConfigError
from stoker.flow.parameters import load_config_file
from stoker.recipes.llama_pretrain import DEFAULT_CONFIG, SETTINGS, check_train_settings, valid_settings
from tests.helpers import EXAMPLES, ROOT


def test_the_key_lists_are_stoker_trains_dataclass_fields():
    import importlib

    for section, (module, cls) in SETTINGS.items():
        real = {f.name for f in dataclasses.fields(getattr(importlib.import_module(module), cls))}
        assert real <= valid_settings()[section], section


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
