"""`current`, class constants, merge_artifacts and parameters from the environment (stoker only, no run)."""

from __future__ import annotations

import pytest

from stoker import FlowSpec, Parameter, step
from stoker.errors import ConfigError
from stoker.flow.current import Current, graph_info
from stoker.flow.graph import FlowGraph
from stoker.flow.parameters import env_var_names, parameters_from_env
from stoker.flow.spec import (
    MergeArtifactsError,
    MissingInMergeArtifactsException,
    UnhandledInMergeArtifactsException,
    _ArtifactView,
)
from stoker.store.paths import current_user


class ApiFlow(FlowSpec):
    """A flow for the unit tests."""

    LIMIT = 3
    NAMES = ("a", "b")
    alpha = Parameter("alpha", default=1)

    def helper(self) -> int:
        return 1

    @staticmethod
    def static_helper() -> int:
        return 2

    @property
    def computed(self) -> int:
        return 3

    @step
    def start(self):
        self.next(self.a, self.b)

    @step
    def a(self):
        self.next(self.join)

    @step
    def b(self):
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


def _task(step: str, is_join: bool | None) -> ApiFlow:
    return ApiFlow._task_instance({}, lambda desc, name: desc["v"], step, is_join=is_join)


def _view(step: str, **values: object) -> _ArtifactView:
    return _ArtifactView({k: {"v": v, "sha": repr(v)} for k, v in values.items()}, lambda d, n: d["v"], step=step)


def test_current_outside_a_task_is_metaflows():
    cur = Current()
    assert (cur.flow_name, cur.run_id, cur.task, cur.run, cur.pathspec, cur.retry_count) == (None,) * 6
    assert cur.tempdir == "." and cur.is_running_flow is False and "run_id" not in cur
    assert cur.get("parameter_names", "d") == "d"
    with pytest.raises(AttributeError, match="parameter_names"):
        cur.parameter_names  # noqa: B018
    with pytest.raises(RuntimeError, match="Graph is not available"):
        cur.graph  # noqa: B018


def test_current_in_a_task_and_its_graph():
    cur = Current()
    graph = FlowGraph(ApiFlow)
    cur._set(flow_name="ApiFlow", run_id="7", step_name="a", task_id="3", retry_count=0, is_running_flow=True,
             parameter_names=["alpha"], graph=lambda: graph_info(graph, ApiFlow.__doc__))
    assert cur.pathspec == "ApiFlow/7/a/3" and "parameter_names" in cur and cur.parameter_names == ["alpha"]
    g = cur.graph
    assert g["steps"]["start"]["type"] == "split-static" and g["steps"]["start"]["next"] == ["a", "b"]  # Metaflow's
    assert g["steps"]["join"]["type"] == "join" and g["doc"] == "A flow for the unit tests."


def test_class_constants_are_read_only_in_a_step():
    assert ApiFlow._constant_names() == {"LIMIT", "NAMES"}
    flow = _task("start", False)
    for name in ("LIMIT", "alpha"):
        with pytest.raises(AttributeError, match="Flow level attributes and Parameters are not modifiable"):
            setattr(flow, name, 5)
    flow.limit = 5  # another name is an ordinary artifact
    assert flow.LIMIT == 3 and flow._new_artifacts() == {"limit": 5}


def test_merge_artifacts_sets_nothing_on_a_conflict():
    flow = _task("join", True)
    inputs = [_view("a", x=1, same="s", only_a="a"), _view("b", x=2, same="s")]
    with pytest.raises(UnhandledInMergeArtifactsException, match=r"conflicting values:\n\[x\]") as e:
        flow.merge_artifacts(inputs)
    assert e.value.artifact_names == ["x"] and not hasattr(flow, "same") and not hasattr(flow, "only_a")
    with pytest.raises(MissingInMergeArtifactsException, match=r"\[nope\] are not present"):
        flow.merge_artifacts(inputs, include=["same", "nope"])
    assert not hasattr(flow, "same")
    flow.x = 3
    flow.merge_artifacts(inputs)
    assert (flow.x, flow.same, flow.only_a) == (3, "s", "a")


def test_merge_artifacts_outside_a_join_and_with_both_lists():
    with pytest.raises(MergeArtifactsError, match=r"step \*a\* is not a join"):
        _task("a", False).merge_artifacts([])
    with pytest.raises(MergeArtifactsError, match="mutually exclusive"):
        _task("join", True).merge_artifacts([], include=["x"], exclude=["y"])


def test_parameters_from_the_environment():
    params = {"alpha": Parameter("alpha"), "my_param": Parameter("my-param"), "beta": Parameter("beta")}
    assert env_var_names("my-param") == ["STOKER_PARAM_MY_PARAM", "METAFLOW_RUN_MY_PARAM"]
    env = {"METAFLOW_RUN_ALPHA": "1", "STOKER_PARAM_ALPHA": "2", "METAFLOW_RUN_MY_PARAM": "m", "STOKER_PARAM_BETA": ""}
    assert parameters_from_env(params, {}, env) == {"alpha": "2", "my-param": "m"}
    assert parameters_from_env(params, {"alpha": "9"}, env) == {"my-param": "m"}  # the command line wins
    with pytest.raises(ConfigError, match=r"'x' is not a valid int .*\$METAFLOW_RUN_N: fix or unset it"):
        parameters_from_env({"n": Parameter("n", default=1)}, {}, {"METAFLOW_RUN_N": "x"})


@pytest.mark.parametrize("env, user", [
    ({"USER": "u"}, "u"),
    ({"USER": "u", "METAFLOW_USER": "mf"}, "mf"),
    ({"USER": "u", "METAFLOW_USER": "mf", "STOKER_USER": "st"}, "st"),
    ({"USER": "root", "SUDO_USER": "alice"}, "alice"),
    ({"USER": "root"}, "root"),
])
def test_current_user_honours_metaflow_user(monkeypatch, env, user):
    for var in ("STOKER_USER", "METAFLOW_USER", "SUDO_USER", "USERNAME", "USER"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert current_user() == user
