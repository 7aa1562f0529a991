"""A secret parameter's value is never printed: not by a conversion error, not as a default in `run --help`."""

from __future__ import annotations

import pytest

from stoker import FlowSpec, Parameter, step
from stoker.cli.flow_cli import build_parser
from stoker.errors import ConfigError

VALUE = "hunter2-not-a-number"


def test_a_bad_secret_value_is_not_quoted_in_the_error():
    p = Parameter("pin", secret=True, type=int)
    with pytest.raises(ConfigError) as e:
        p.convert(VALUE)
    assert VALUE not in str(e.value) and "--pin" in str(e.value)


def test_a_non_secret_bad_value_is_still_quoted():
    with pytest.raises(ConfigError, match=VALUE):
        Parameter("n", type=int).convert(VALUE)


class _HelpFlow(FlowSpec):
    token = Parameter("token", secret=True, default="tok-default-7c1e", help="an API token")
    n = Parameter("n", default=5, type=int)

    @step
    def start(self):
        self.next(self.end)

    @step
    def end(self):
        pass


def test_run_help_does_not_show_a_secret_default():
    parser = build_parser(_HelpFlow)
    run = parser._subparsers._group_actions[0].choices["run"]
    text = run.format_help()
    assert "tok-default-7c1e" not in text and "an API token" in text
    assert "default 5" in text  # other parameters keep their default
