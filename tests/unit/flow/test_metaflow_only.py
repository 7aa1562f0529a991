"""Metaflow names stoker does not implement: importable, refused in one line by the flow's check (or when called);
deploy-only flow decorators accepted and ignored by `run`; @exit_hook's arguments checked."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from stoker.errors import ConfigError

FLOW = """
from stoker import FlowSpec, step, {name}

{flow_deco}
class F(FlowSpec):
    {step_deco}
    @step
    def start(self):
        self.next(self.end)

    @step
    def end(self):
        pass

if __name__ == "__main__":
    F()
"""


def _check(tmp_path, name: str, flow_deco: str = "", step_deco: str = "") -> subprocess.CompletedProcess:
    f = tmp_path / "flow.py"
    f.write_text(textwrap.dedent(FLOW).format(name=name, flow_deco=flow_deco, step_deco=step_deco))
    return subprocess.run([sys.executable, str(f), "check"], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("name,flow_deco,step_deco", [
    ("kubernetes", "", "@kubernetes(cpu=4)"),
    ("conda", "", "@conda(libraries={'pandas': '2.0'})"),
    ("pypi", "", "@pypi(packages={'pandas': '2.0'})"),
    ("conda_base", "@conda_base(python='3.11')", ""),
    ("pypi_base", "@pypi_base(packages={'x': '1'})", ""),
    ("checkpoint", "", "@checkpoint"),
])
def test_a_metaflow_only_decorator_is_refused_in_one_line(tmp_path, name, flow_deco, step_deco):
    out = _check(tmp_path, name, flow_deco, step_deco)
    assert out.returncode != 0
    assert "Traceback" not in out.stderr + out.stdout
    assert f"@{name} is Metaflow's, not stoker's" in out.stderr + out.stdout
    assert "flow.py:" in out.stderr + out.stdout  # where it is


@pytest.mark.parametrize("deco", ["@schedule(hourly=True)", "@trigger(event='data_updated')",
                                  "@trigger_on_finish(flow='FirstFlow')"])
def test_deploy_only_flow_decorators_are_accepted(tmp_path, deco):
    out = _check(tmp_path, deco[1:].split("(")[0], deco)
    assert out.returncode == 0, out.stderr


def test_a_deploy_only_decorator_checks_its_arguments():
    from stoker import schedule

    with pytest.raises(ConfigError, match="no argument"):
        schedule(hourli=True)(type("X", (), {}))


@pytest.mark.parametrize("name", ["S3", "parallel_map", "parallel_imap_unordered"])
def test_a_metaflow_only_callable_says_what_to_use(name):
    import stoker

    with pytest.raises(ConfigError, match=f"{name}: .*not part of stoker"):
        getattr(stoker, name)()


def test_exit_hook_needs_a_hook_and_takes_several():
    from stoker import FlowSpec, exit_hook

    with pytest.raises(ConfigError, match="on_success"):
        exit_hook(options={})(type("X", (FlowSpec,), {}))
    with pytest.raises(ConfigError, match="neither a function"):
        exit_hook(on_error=[3])(type("Y", (FlowSpec,), {}))

    def a():
        pass

    klass = exit_hook(on_success=[a])(exit_hook(on_error=["mod.b"])(type("Z", (FlowSpec,), {})))
    decos = [d for d in klass._stoker_flow_decorators if d.name == "exit_hook"]
    assert [d.hook_names(True) for d in decos] == [[], ["a"]] and decos[0].hook_names(False) == ["mod.b"]
