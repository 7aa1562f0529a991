"""Flow and step API: `current`, class constants, a gang's `self.input`, merge_artifacts, env parameters, options."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.compat.conftest import compare, outputs

pytestmark = pytest.mark.slow

READ_ONLY = "Flow level attributes and Parameters are not modifiable"
# Metaflow's local gang runs its other nodes with the `python` on PATH: make it the engine's own
ENV = {"METAFLOW_RUN_ALPHA": "7", "METAFLOW_RUN_MY_PARAM": "from-env", "METAFLOW_RUN_FLAG": "1"}


@pytest.fixture(scope="module")
def api(both, engines):
    """flow_api_flow.py run once per engine, with parameters from the environment and one on the command line."""
    path = os.pathsep.join([str(Path(engines["metaflow"].python).parent), os.environ.get("PATH", "")])
    return both("flow_api_flow.py", "--my-param", "from-cli", env={**ENV, "PATH": path})


def _artifacts(runs, step: str, names: list[str]) -> dict:
    return {n: r.client(f"""
        from metaflow import Flow
        task = Flow("FlowApiFlow").latest_run["{step}"].task
        result = {{name: task.data.__getattr__(name) for name in {names!r}}}
    """) for n, r in runs.items()}


def test_flow_runs(api, request):
    """The flow using every item of this area runs to the end."""
    compare(request, "exit status", {n: r.proc.returncode for n, r in api.items()}, 0)
    assert all(r.ok for r in api.values()), outputs(api)


def test_current_in_a_task(api, request):
    """In a step, `current` has the run's ids, user, namespace, parameter_names, task and run."""
    got = _artifacts(api, "start", ["cur"])
    for v in got.values():
        cur = v["cur"]
        ids = f"FlowApiFlow/{cur['run_id']}/start/{cur['task_id']}"
        cur["ids_consistent"] = cur.pop("pathspec") == ids == cur.pop("task_pathspec") and \
            cur.pop("run_pathspec") == f"FlowApiFlow/{cur.pop('run_id')}"
        cur.pop("task_id")
    compare(request, "current's attributes in the start step", got, {"cur": {
        "flow_name": "FlowApiFlow", "step_name": "start", "retry_count": 0, "origin_run_id": None,
        "is_running_flow": True, "username": "tester", "namespace": "user:tester", "tempdir_is_dir": True,
        "parameter_names": ["alpha", "flag", "my_param"], "in": [True, False], "get": "dflt",
        "ids_consistent": True}})
    compare(request, "current.parameter_names in a join", _artifacts(api, "join", ["join_params"]),
            {"join_params": ["alpha", "flag", "my_param"]})


def test_current_graph(api, request):
    """`current.graph` describes the flow: file, start and end step, each step's type and successors."""
    compare(request, "current.graph's steps (type, next), file, ends and doc", _artifacts(api, "start", ["graph"]))


def test_current_outside_a_task(api, request):
    """Outside a task, `current`'s ids are None, tempdir is ".", and task-only attributes raise."""
    got = {n: r.client("""
        from metaflow import current
        result = {}
        for a in ["flow_name", "run_id", "step_name", "task_id", "retry_count", "origin_run_id", "pathspec",
                  "namespace", "username", "tempdir", "is_running_flow", "task", "run", "parameter_names",
                  "parallel", "graph"]:
            try:
                result[a] = getattr(current, a)
            except Exception as e:
                result[a] = type(e).__name__
        result["in"] = ["run_id" in current, "is_running_flow" in current]
        result["get"] = current.get("parameter_names", "dflt")
    """) for n, r in api.items()}
    compare(request, "current outside a task", got, {
        "flow_name": None, "run_id": None, "step_name": None, "task_id": None, "retry_count": None,
        "origin_run_id": None, "pathspec": None, "namespace": None, "username": None, "tempdir": ".",
        "is_running_flow": False, "task": None, "run": None, "parameter_names": "AttributeError",
        "parallel": "AttributeError", "graph": "RuntimeError", "in": [False, True], "get": "dflt"})


def test_class_constants_cannot_be_assigned(api, request):
    """Assigning a class-level constant or a Parameter in a step raises AttributeError, as in Metaflow."""
    got = _artifacts(api, "start", ["set_const", "set_param", "limit"])
    got_end = _artifacts(api, "end", ["end_const"])
    compare(request, "self.LIMIT = ... and self.alpha = ... raise; self.LIMIT reads", got,
            check=lambda v: v["set_const"][0] == v["set_param"][0] == "AttributeError" and v["limit"] == 5
            and v["set_const"][1].startswith(READ_ONLY) and v["set_param"][1].startswith(READ_ONLY))
    compare(request, "self.LIMIT = ... raises in the end step too", got_end,
            check=lambda v: v["end_const"][0] == "AttributeError" and v["end_const"][1].startswith(READ_ONLY))
    compare(request, "a class constant is an artifact of the start task, a join and the run", {n: r.client("""
        from metaflow import Flow
        run = Flow("FlowApiFlow").latest_run
        result = [run["start"].task.data.LIMIT, run["join"].task.data.LIMIT, run.data.LIMIT]
    """) for n, r in api.items()}, [5, 5, 5])


def test_gang_input_is_the_node_index(api, request):
    """In a num_parallel gang, self.input is the node index (as current.parallel.node_index)."""
    compare(request, "[self.input, node_index, num_nodes, self.index, foreach_stack()] per gang node",
            _artifacts(api, "gang_join", ["nodes"]),
            {"nodes": [[0, 0, 2, 0, [[0, None, 0]]], [1, 1, 2, 1, [[1, None, 1]]]]})
    compare(request, "[input, index] of each gang node seen from the join", _artifacts(api, "gang_join",
            ["join_inputs"]), {"join_inputs": [[0, 0], [1, 1]]})


def test_merge_artifacts_conflicts_and_misuse(api, request):
    """merge_artifacts raises on a conflict and sets nothing; it raises outside a join and on include+exclude."""
    got = _artifacts(api, "join", ["conflict", "set_after_conflict", "missing", "both_kw", "merged"])
    compare(request, "exception types of a conflict and of a missing include",
            {n: [v["conflict"][0], v["missing"][0]] for n, v in got.items()},
            ["UnhandledInMergeArtifactsException", "MissingInMergeArtifactsException"])
    compare(request, "messages of a conflict and of a missing include",
            {n: [v["conflict"][1], v["missing"][1]] for n, v in got.items()})
    compare(request, "nothing set after a conflict; merged after resolving it",
            {n: [v["set_after_conflict"], v["merged"]] for n, v in got.items()}, [[False, False], ["s", "a", 2]])
    compare(request, "include= with exclude= is refused", {n: v["both_kw"][1] for n, v in got.items()},
            "`exclude` and `include` are mutually exclusive in merge_artifacts")
    compare(request, "merge_artifacts outside a join is refused",
            {n: v["not_join"][1] for n, v in _artifacts(api, "start", ["not_join"]).items()},
            "merge_artifacts can only be called in a join and step *start* is not a join")


def test_parameters_from_the_environment(api, request):
    """METAFLOW_RUN_<NAME> gives a parameter's value; the command line wins over it."""
    compare(request, "[alpha, my-param, flag] from METAFLOW_RUN_* and --my-param",
            _artifacts(api, "start", ["params"]), {"params": [7, "from-cli", True]})


def test_top_level_options_and_metaflow_user(both, request):
    """Metaflow's options before the command are accepted; METAFLOW_USER names the user, namespace and tag."""
    top = ("--quiet", "--no-pylint", "--metadata=local", "--datastore", "local", "--environment=local",
           "--event-logger", "nullSidecarLogger", "--monitor=nullSidecarMonitor", "--package-suffixes=.py,.txt",
           "--with", "retry")
    runs = both("top_options_flow.py", "--size", "4", "--tag", "t1", top=top, env={"METAFLOW_USER": "mfuser"})
    compare(request, "exit status", {n: r.proc.returncode for n, r in runs.items()}, 0)
    got = {n: r.client("""
        from metaflow import Flow, get_namespace
        run = Flow("TopOptionsFlow").latest_run  # found in the default namespace, user:mfuser
        result = {"who": run["start"].task.data.who, "doubled": run.data.doubled,
                  "user_tag": "user:mfuser" in run.tags, "namespace": get_namespace()}
    """) for n, r in runs.items()}
    compare(request, "user, namespace, current.tags, the run's user tag, the client's namespace, a parameter", got,
            {"who": ["mfuser", "user:mfuser", ["t1"]], "doubled": 8, "user_tag": True, "namespace": "user:mfuser"})


@pytest.mark.parametrize("option", ["--datastore=nope", "--metadata=service"])
def test_refused_top_level_options(both, request, option):
    """A top-level option value Metaflow does not know, or stoker cannot use, stops with a non-zero exit."""
    runs = both("top_options_flow.py", top=("--no-pylint", option), key=option)
    compare(request, f"{option}: exit status is non-zero", {n: r.proc.returncode for n, r in runs.items()},
            check=lambda code: code != 0)
    assert option.split("=")[0] in runs["stoker"].output, outputs(runs)
