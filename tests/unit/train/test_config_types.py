"""Every trainer setting from the command line or a TOML file is type-checked with one message that
names the setting, the value and the expected type (issue 13)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from stoker.errors import ConfigError
from stoker.train.config import from_dict, load_config


def test_steps_abc_on_the_command_line_names_option_value_and_type() -> None:
    p = subprocess.run([sys.executable, "-m", "stoker.train", "--steps", "abc", "--print-config"],
                       capture_output=True, text=True, timeout=120, env=os.environ)
    assert p.returncode != 0
    assert "train.steps='abc': expected an integer" in p.stderr
    assert "Traceback" not in p.stderr and "not supported" not in p.stderr


@pytest.mark.parametrize("override, message", [
    ("train.lr=abc", "train.lr='abc': expected a number"),
    ("train.steps=2.5", "train.steps=2.5: expected an integer"),
    ("train.seed=true", "train.seed=True: expected an integer"),
    ("data.shuffle=maybe", "data.shuffle='maybe': expected true or false"),
    ("parallel.tp=two", "parallel.tp='two': expected an integer"),
    ("checkpoint.keep=[1]", "checkpoint.keep=[1]: expected an integer"),
    ("model.dim=abc", "model.dim='abc': expected an integer"),
    ("model.rope_scaling=5", "model.rope_scaling=5: expected a table"),
])
def test_overrides_are_type_checked(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert message in str(e.value)


def test_toml_values_are_type_checked_and_name_the_file(tmp_path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('[train]\nsteps = "ten"\n')
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert "train.steps='ten': expected an integer" in str(e.value) and str(path) in str(e.value)
    path.write_text('[checkpoint]\ndir = 5\n')
    with pytest.raises(ConfigError, match=r"checkpoint.dir=5: expected a string"):
        load_config(path)
    path.write_text('train = 5\n')
    with pytest.raises(ConfigError, match=r"train=5: expected a table"):
        load_config(path)


def test_string_settings_keep_their_text_and_ints_widen_to_float() -> None:
    cfg = load_config(None, ["checkpoint_dir=2024", "data.split=5", "lr=1", "steps=7"])
    assert cfg.checkpoint.dir == "2024" and cfg.data.split == "5"
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float) and cfg.train.steps == 7
    assert load_config(None, ['checkpoint.dir="quoted"']).checkpoint.dir == "quoted"
    assert from_dict({"train": {"steps": 3}, "model": {"max_seq_len": 64}}).model.resolve().max_seq_len == 64
