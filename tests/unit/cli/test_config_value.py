"""A Config's value from `--config-value NAME VALUE` (before or after `run`) or $METAFLOW_FLOW_CONFIG_VALUE /
$STOKER_FLOW_CONFIG_VALUE (and files from $METAFLOW_FLOW_CONFIG), as Metaflow reads them (issue 35)."""

from __future__ import annotations

import pytest

from stoker import Config, FlowSpec, step
from stoker.cli.flow_cli import _move_top_config, _run_configs
from stoker.errors import ConfigError
from stoker.flow.parameters import ConfigText


class CfgFlow(FlowSpec):
    config = Config("config", default_value={"timeout": 5})

    @step
    def start(self):
        self.next(self.end)

    @step
    def end(self):
        pass


def test_config_value_before_the_command_moves_after_it():
    argv = ["--config-value", "config", '{"timeout": 3}', "run", "--tag", "x"]
    assert _move_top_config(argv) == ["run", "--config-value", "config", '{"timeout": 3}', "--tag", "x"]
    argv = ["--config", "a", "a.toml", "--config-value", "b", "{}", "run"]
    assert _move_top_config(argv) == ["run", "--config", "a", "a.toml", "--config-value", "b", "{}"]


def test_config_value_is_the_configs_text():
    got = _run_configs(CfgFlow, [], [["config", '{"timeout": 3}']])
    assert got == {"config": '{"timeout": 3}'} and isinstance(got["config"], ConfigText)
    assert CfgFlow.config.resolve(got["config"]) == {"timeout": 3}


@pytest.mark.parametrize("var", ["METAFLOW_FLOW_CONFIG_VALUE", "STOKER_FLOW_CONFIG_VALUE"])
def test_config_value_from_the_environment(monkeypatch, var):
    monkeypatch.delenv("METAFLOW_FLOW_CONFIG_VALUE", raising=False)
    monkeypatch.setenv(var, '{"config": {"timeout": 3}}')
    got = _run_configs(CfgFlow, [])
    assert CfgFlow.config.resolve(got["config"]) == {"timeout": 3}
    assert _run_configs(CfgFlow, [], [["config", '{"timeout": 9}']]) == {"config": '{"timeout": 9}'}, \
        "the command line wins over the environment"


def test_config_file_from_the_environment(monkeypatch, tmp_path):
    (tmp_path / "c.json").write_text('{"timeout": 4}')
    monkeypatch.setenv("METAFLOW_FLOW_CONFIG", f'{{"config": "{tmp_path / "c.json"}"}}')
    assert _run_configs(CfgFlow, []) == {"config": str(tmp_path / "c.json")}


def test_a_file_and_a_value_for_one_config_are_refused(tmp_path):
    (tmp_path / "c.json").write_text("{}")
    with pytest.raises(ConfigError, match="both a file .* and a value"):
        _run_configs(CfgFlow, [["config", str(tmp_path / "c.json")]], [["config", "{}"]])


def test_a_bad_environment_value_is_one_error(monkeypatch):
    monkeypatch.setenv("METAFLOW_FLOW_CONFIG_VALUE", "timeout=3")
    with pytest.raises(ConfigError, match=r"\$METAFLOW_FLOW_CONFIG_VALUE must be a JSON object"):
        _run_configs(CfgFlow, [])


def test_a_value_that_does_not_parse_names_the_config():
    with pytest.raises(ConfigError, match="config 'config': the value given cannot be parsed"):
        CfgFlow.config.resolve(ConfigText("{not json"))
