"""Forms Metaflow's documentation uses: `--with module.decorator:k=v` and `Config(parser="module.function")`."""

from __future__ import annotations

import sys

import pytest

from stoker import FlowSpec, step
from stoker.errors import ConfigError
from stoker.flow.decorators import apply_with
from stoker.flow.parameters import Config

DECO = '''
from stoker import user_step_decorator

@user_step_decorator
def tagged(step_name, flow, inputs=None, attributes=None):
    flow.seen = dict(attributes)
    yield
'''


def _flow() -> type:
    class F(FlowSpec):
        @step
        def start(self):
            self.next(self.end)

        @step
        def end(self):
            pass

    return F


def test_with_a_module_path_attaches_a_user_decorator_to_every_step(tmp_path, monkeypatch):
    (tmp_path / "docs_deco_mod.py").write_text(DECO)
    monkeypatch.syspath_prepend(str(tmp_path))
    flow = _flow()
    apply_with(flow, ["docs_deco_mod.tagged:silent=1"])
    apply_with(flow, ["docs_deco_mod.tagged"])  # a second one is ignored, as Metaflow's --with does
    for f in (flow.start, flow.end):
        assert [(w.decorator_name, w.get_args_kwargs()) for w in f.wrappers] == \
            [("docs_deco_mod.tagged", ([], {"silent": 1}))]
    sys.modules.pop("docs_deco_mod", None)


@pytest.mark.parametrize("spec, words", [("no_such_module_x.deco", "cannot import 'no_such_module_x'"),
                                         ("json.loads", "unknown decorator 'json.loads'"),
                                         ("nodots", "unknown decorator 'nodots'")])
def test_with_refuses_what_is_no_decorator(spec, words):
    with pytest.raises(ConfigError, match=words):
        apply_with(_flow(), [spec])


def test_parser_named_by_a_string(tmp_path):
    (tmp_path / "c.toml").write_text("[resources]\ncpu = 1\n")
    assert Config("c", parser="tomllib.loads").resolve(str(tmp_path / "c.toml")) == {"resources": {"cpu": 1}}
    assert Config("c", default_value='{"a": 1}', parser="json.loads").resolve() == {"a": 1}


@pytest.mark.parametrize("parser, words", [("no_such_module_x.loads", "cannot import"), ("json.nope", "not a function"),
                                           ("loads", "must be 'module.function'"), ("json.dumps", "not a mapping")])
def test_a_bad_parser_string_is_one_line(parser, words):
    with pytest.raises(ConfigError, match=words):
        Config("c", default_value="{}", parser=parser).resolve()
