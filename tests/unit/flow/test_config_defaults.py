"""Config values as Metaflow's ConfigValue (nested, immutable), functions as Config defaults, METAFLOW_PRODUCTION."""

from __future__ import annotations

import pickle

import pytest

from stoker.cli.flow_cli import _env_flag
from stoker.errors import ConfigError
from stoker.flow.configs import ConfigValue
from stoker.flow.parameters import Config, ParameterContext


def test_nested_values_are_config_values_and_nothing_can_change():
    c = ConfigValue({"a": {"value": 5, "items": [{"x": 1}]}})
    assert c["a"].value == 5 and c.a["items"][0].x == 1 and isinstance(c["a"], ConfigValue)
    for change in (lambda: c.__setitem__("k", 1), lambda: setattr(c, "k", 1), lambda: c["a"].update({}),
                   lambda: c.pop("a"), lambda: c.__delitem__("a")):
        with pytest.raises(TypeError, match="immutable"):
            change()
    back = pickle.loads(pickle.dumps(c))
    assert back == c and isinstance(back["a"], ConfigValue)
    plain = c.to_dict()
    plain["a"]["value"] = 6  # a plain copy may change
    assert c.a.value == 5 and not hasattr(c, "missing")


def test_functions_as_config_defaults(tmp_path):
    seen = []

    def value(ctx):
        seen.append(ctx)
        return {"n": 1, "who": ctx.parameter_name}

    ctx = ParameterContext(flow_name="F", user_name="u", parameter_name=None, configs={"x": 1})
    got = Config("cfg", default_value=value).resolve(ctx=ctx)
    assert got == {"n": 1, "who": "cfg"} and seen[0].configs is None  # as Metaflow: no configs in a Config's
    assert Config("t", default_value=lambda ctx: '{"a": 2}').resolve(ctx=ctx) == {"a": 2}
    (tmp_path / "c.json").write_text('{"b": 3}')
    assert Config("p", default=lambda ctx: str(tmp_path / "c.json")).resolve(ctx=ctx) == {"b": 3}
    with pytest.raises(ConfigError, match="default_value function of config 'bad' raised ZeroDivisionError"):
        Config("bad", default_value=lambda ctx: 1 / 0).resolve(ctx=ctx)
    with pytest.raises(ConfigError, match="not both"):
        Config("both", default="x.json", default_value={})


@pytest.mark.parametrize("value,expected", [(None, False), ("1", True), ("True", True), ("y", True), ("0", False),
                                            ("no", False), ("bad", ConfigError), ("", ConfigError)])
def test_production_from_the_environment_as_click_reads_it(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("METAFLOW_PRODUCTION", raising=False)
    else:
        monkeypatch.setenv("METAFLOW_PRODUCTION", value)
    if expected is ConfigError:
        with pytest.raises(ConfigError, match="not a valid boolean"):
            _env_flag("METAFLOW_PRODUCTION")
    else:
        assert _env_flag("METAFLOW_PRODUCTION") is expected
