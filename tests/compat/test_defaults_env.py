"""Functions as defaults, nested ConfigValues, python_version metadata, @project's branch from METAFLOW_BRANCH.

Issue 28, items 3, 4, 9 and 10: Parameter and Config defaults computed by functions (reading ctx.configs and
current.project_*), nested ConfigValues, task metadata, and @project's branch from METAFLOW_BRANCH /
METAFLOW_PRODUCTION."""

from __future__ import annotations

import re

import pytest

from tests.compat.conftest import compare, outputs

pytestmark = pytest.mark.slow

FLOW = "defaults_flow.py"
START = """
    from metaflow import Flow, namespace
    namespace(None)
    t = Flow("DefaultsFlow").latest_run["start"].task
    result = {k: getattr(t.data, k) for k in ("nested_value", "item_a", "item_type", "errors", "cfg_plain",
                                              "side_from", "size", "names", "proj")}
    result["cfg_is_dict"] = isinstance(t.data.cfg, dict)
    result["python_version"] = t.metadata_dict.get("python_version")
"""


def _ok(request, runs):
    compare(request, "exit status", {n: r.proc.returncode for n, r in runs.items()}, 0)


def test_function_defaults(both, request):
    """Config(default_value=fn), Config(default=fn), Parameter(default=fn) reading ctx.configs and current."""
    import platform

    runs = both(FLOW)
    _ok(request, runs)
    got = {n: r.client(START) for n, r in runs.items()}
    # each engine's task reports its own interpreter's version (Metaflow's venv may have another Python)
    versions = {n: v.pop("python_version") for n, v in got.items()}
    assert all(re.fullmatch(r"\d+\.\d+\.\d+", str(v)) for v in versions.values()), versions
    assert versions["stoker"] == platform.python_version(), versions
    compare(request, "defaults computed from the context, nested ConfigValues, immutability, metadata", got, {
        "nested_value": 5, "item_a": 1, "item_type": "ConfigValue",
        "errors": {"setitem": "TypeError", "nested_setitem": "TypeError", "setattr": "TypeError",
                   "update": "TypeError"},
        "cfg_plain": {"size": 3, "nested": {"value": 5, "items": [{"a": 1}]}, "who": "cfg", "had_configs": False},
        "side_from": "file", "size": 6, "names": "cfg,side", "proj": "defproj|user.tester", "cfg_is_dict": True}), \
        outputs(runs)


def test_branch_from_shell_environment(both, request):
    """METAFLOW_BRANCH and METAFLOW_PRODUCTION in the shell give prod.<branch>; a default function sees it."""
    runs = both(FLOW, env={"METAFLOW_BRANCH": "shell", "METAFLOW_PRODUCTION": "true"}, key="shellenv")
    _ok(request, runs)
    got = {n: r.client(START)["proj"] for n, r in runs.items()}
    compare(request, "current.project_name|branch_name in a default function", got, "defproj|prod.shell")


ENV_FLOW = "project_env_flow.py"
BRANCH = """
    from metaflow import Flow, namespace
    namespace(None)
    run = Flow("ProjectEnvFlow").latest_run
    t = run["start"].task
    result = {"branch": t.data.branch, "production": t.data.production,
              "tags": sorted(x for x in run.system_tags if x.startswith("project_branch:"))}
"""


@pytest.mark.parametrize("case,top,env,branch", [
    ("file", (), {}, "test.from_file"),
    ("file+production-env", (), {"METAFLOW_PRODUCTION": "1"}, "prod.from_file"),
    ("option-wins", ("--branch", "cli"), {}, "test.cli"),
    ("production-option", ("--production",), {}, "prod.from_file"),
])
def test_branch_set_by_flow_file(both, request, case, top, env, branch):
    """A flow file that sets METAFLOW_BRANCH before its class: test.<branch>; --branch wins over it."""
    runs = both(ENV_FLOW, top=("--no-pylint", *top), env=env, key=case)
    _ok(request, runs)
    got = {n: r.client(BRANCH) for n, r in runs.items()}
    compare(request, f"branch ({case})", got, {"branch": branch, "production": branch.startswith("prod"),
                                               "tags": [f"project_branch:{branch}"]}), outputs(runs)


def test_bad_production_value(both, request):
    """METAFLOW_PRODUCTION=bad is refused before anything runs."""
    runs = both(ENV_FLOW, env={"METAFLOW_PRODUCTION": "bad"}, key="bad")
    compare(request, "refused", {n: r.proc.returncode != 0 for n, r in runs.items()}, True)
    compare(request, "the error names the value", {n: "bad" in r.output and "boolean" in r.output
                                                   for n, r in runs.items()}, True)
