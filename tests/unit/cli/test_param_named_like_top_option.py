"""A flow Parameter named like one of Metaflow's top-level options (`environment`, `metadata`, ...) is the
flow's: `run --environment prod` sets it, as in Metaflow (it used to be dropped silently)."""

from __future__ import annotations

import pytest

from stoker import FlowSpec, Parameter, step
from stoker.cli.flow_cli import _param_options, _split_compat, build_parser
from stoker.errors import ConfigError


class EnvFlow(FlowSpec):
    environment = Parameter("environment", default="dev")
    metadata = Parameter("metadata", default="none")

    @step
    def start(self):
        self.next(self.end)

    @step
    def end(self):
        pass


def test_parameter_named_like_a_top_level_option_is_kept():
    argv = _split_compat(["run", "--environment", "prod", "--metadata=m1", "--no-pylint"], _param_options(EnvFlow))
    assert argv == ["run", "--environment", "prod", "--metadata=m1"]
    args = build_parser(EnvFlow).parse_args(argv)
    assert (args.param__environment, args.param__metadata) == ("prod", "m1")


def test_a_top_level_option_after_the_command_is_refused():
    """Metaflow refuses `run --datastore s3`; stoker used to drop it silently (and run on the local store)."""
    with pytest.raises(ConfigError, match="--datastore is an option of the flow.*before the command"):
        _split_compat(["run", "--datastore", "s3"], _param_options(EnvFlow))
