"""Custom decorators and mutators: user_step_decorator, UserStepDecorator, StepMutator and FlowMutator.

Metaflow 2.19's documented way to write decorators and to change a flow's decorators and parameters from code:
the same flow file on both engines gives the same artifacts."""

from __future__ import annotations

import pytest

from tests.compat.conftest import compare, outputs

pytestmark = pytest.mark.slow

_ARTIFACTS = """
    from metaflow import Flow
    run = Flow("{flow}").latest_run
    result = {{"successful": run.successful, "steps": {{}}}}
    for s in run:
        t = s.task
        result["steps"][s.id] = {{a.id: a.data for a in t.artifacts if not a.id.startswith("_") and a.id != "name"}}
"""


def _artifacts(runs, flow: str) -> dict:
    return {n: r.client(_ARTIFACTS.format(flow=flow)) for n, r in runs.items()}


def test_user_step_decorators(both, request):
    """Generator and class decorators run around steps (name, inputs, arguments); skip, replace, swallow an error.

    Code before and after the step with its name, flow, inputs and arguments; a step skipped (USER_SKIP_STEP),
    one replaced by a callable, an exception swallowed."""
    runs = both("user_step_decorators_flow.py")
    compare(request, "exit status", {n: r.proc.returncode for n, r in runs.items()}, 0)
    got = _artifacts(runs, "UserStepDecoratorsFlow")
    compare(request, "every step's artifacts", got)
    steps = got["stoker"]["steps"]
    assert steps["start"]["before"] == "before start [('label', 'first'), ('n', 2)]", outputs(runs)
    assert "never" not in steps["skipped"] and "never_either" not in steps["replaced"]
    assert steps["failing"]["swallowed"] == "swallowed here"
    assert steps["join"]["class_pre"] == "join:join:2" and steps["join"]["timed"]["inputs"] is True


def test_mutators(both, request):
    """A FlowMutator adds a Parameter, a StepMutator and @environment to every step; the @retry it adds retries.

    The Parameter's default comes from a Config; the StepMutator takes arguments and adds @retry, so the step
    that fails once succeeds on its retry."""
    runs = both("mutators_flow.py")
    compare(request, "exit status", {n: r.proc.returncode for n, r in runs.items()}, 0)
    got = _artifacts(runs, "MutatorsFlow")
    compare(request, "every step's artifacts", got)
    end = got["stoker"]["steps"]["end"]
    assert end["attempt"] == 1 and end["added_value"] == 5 and end["end_env"] == "end", outputs(runs)
    assert end["specs"] == "AddRetry"
    attempts = {n: r.client("""
        from metaflow import Flow
        result = [t.id for t in Flow("MutatorsFlow").latest_run["flaky"]]
    """) for n, r in runs.items()}
    compare(request, "tasks of the step that failed once", {n: len(v) for n, v in attempts.items()}, 1)


def test_mutators_in_spawned_tasks(engines, tmp_path, request):
    """stoker alone: a task started as a new process (`python flow.py _task SPEC`, as on Slurm and Batch) runs
    the mutators again with the run's Config values, so its step has the @retry and @environment they add."""
    from tests.compat.engines import run_flow

    run = run_flow(engines["stoker"], "mutators_flow.py", tmp_path, env={"STOKER_TASK_LAUNCH": "subprocess"})
    assert run.ok, run.output[-3000:]
    got = run.client(_ARTIFACTS.format(flow="MutatorsFlow"))
    end = got["steps"]["end"]
    assert (end["attempt"], end["added_value"], end["end_env"], end["specs"]) == (1, 5, "end", "AddRetry")
