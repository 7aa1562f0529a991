"""Conditional transitions: self.next({...}, condition=...), switches in branches and foreaches, recursion, resume."""

from __future__ import annotations

import pytest

from tests.compat.conftest import compare, outputs
from tests.compat.engines import ENGINES, run_flow

pytestmark = pytest.mark.slow

STEPS = '''
from metaflow import Flow
run = Flow("SwitchFlow").latest_run
result = {"steps": sorted(s.id for s in run), "tasks": {s.id: len(list(s)) for s in run},
          "summary": run.data.summary, "successful": run.successful,
          "loop": sorted(t.data.count for t in run["loop"])}
'''


def test_switch_runs_only_the_chosen_case(both, request):
    """Only the chosen case runs, at the top, in a static branch and in a foreach; cases converge without inputs."""
    runs = both("switch_flow.py", "--mode", "slow")
    compare(request, "exit status", {n: r.proc.returncode for n, r in runs.items()}, 0)
    got = {n: r.client(STEPS) for n, r in runs.items()}
    compare(request, "steps, tasks per step, end artifacts", got)
    assert "fast" not in got["stoker"]["steps"] and "left_odd" not in got["stoker"]["steps"], outputs(runs)
    assert got["stoker"]["summary"] == "slow:['left-even', 'right']:[1, 20, 30]:3", outputs(runs)


def test_recursive_switch_runs_one_task_per_pass(both, request):
    """A step that switches back to itself runs once per pass, each pass reading the previous one's artifacts."""
    runs = both("switch_flow.py", "--mode", "slow")
    got = {n: r.client('''
        from metaflow import Flow
        run = Flow("SwitchFlow").latest_run
        result = sorted([t.data.count, t.data.again] for t in run["loop"])
    ''') for n, r in runs.items()}
    compare(request, "(count, again) of every pass of loop", got, [[1, "yes"], [2, "yes"], [3, "no"]])


def test_switch_condition_without_case_fails(both, request):
    """A condition value with no matching key fails the step with Metaflow's RuntimeError message."""
    runs = both("switch_flow.py", "--mode", "nope")
    compare(request, "exit status is not 0", {n: r.proc.returncode != 0 for n, r in runs.items()}, True)
    essence = "RuntimeError: Switch condition variable 'mode_seen' has value 'nope' which is not in the available " \
              "cases: ['fast', 'slow']"
    compare(request, "the error names the variable, its value and the cases",
            {n: essence in r.output for n, r in runs.items()}, True)


def test_show_lists_switch_cases(both, request):
    """`show` lists a switch step's cases as its next steps."""
    runs = both("switch_flow.py", command="show")
    compare(request, "exit status", {n: r.proc.returncode for n, r in runs.items()}, 0)
    compare(request, "start => fast, slow; loop => loop, end",
            {n: "=> fast, slow" in r.output and "=> loop, end" in r.output for n, r in runs.items()}, True)


def test_resume_across_switches(engines, tmp_path, request):
    """Resume clones the chosen cases and every pass of a recursive switch, then reruns the failed step."""
    got, outs = {}, {}
    for name in ENGINES:
        folder, env = tmp_path / name, {"SWITCH_FAIL_END": "1"}
        first = run_flow(engines[name], "switch_flow.py", folder, env=env)
        (folder / "fixed.txt").write_text("ok")
        second = run_flow(engines[name], "switch_flow.py", folder, command="resume", env=env)
        outs[name] = first.output[-1500:] + second.output[-1500:]
        got[name] = [first.proc.returncode != 0, second.proc.returncode] + [second.client('''
            from metaflow import Flow
            run = Flow("SwitchFlow").latest_run
            result = {"summary": run.data.summary, "end_in_this_run": run.data.run_of_end == run.id,
                      "origins": {s.id: sorted(t.metadata_dict.get("origin-task-id") is not None for t in s)
                                  for s in run}}
        ''')]
    expected_origins = {s: [True] * n for s, n in {
        "start": 1, "fast": 1, "fan": 1, "left": 1, "left_even": 1, "left_done": 1, "right": 1, "join_sides": 1,
        "spread": 1, "each": 3, "big": 2, "small": 1, "join_each": 1, "loop": 3}.items()}
    expected_origins["end"] = [False]
    compare(request, "first run fails, resume succeeds, cloned tasks", got,
            [True, 0, {"summary": "fast:['left-even', 'right']:[1, 20, 30]:3", "end_in_this_run": True,
                       "origins": expected_origins}])
    assert got["stoker"][1] == 0, outs["stoker"]


@pytest.mark.parametrize("flow, essence", [
    ("join_split_flow.py", "both a join"),
    ("switch_to_join_flow.py", "cannot lead directly to a join|cannot lead straight to a join"),
    ("switch_back_flow.py", "loop"),
])
def test_invalid_switch_graphs_are_refused(both, request, flow, essence):
    """Refused before anything runs: a join that also splits, a case straight to a join, a switch to an earlier step."""
    runs = both(flow)
    compare(request, f"{flow}: exit status is not 0", {n: r.proc.returncode != 0 for n, r in runs.items()}, True)
    compare(request, f"{flow}: the message says why",
            {n: any(e in r.output for e in essence.split("|")) for n, r in runs.items()}, True)
    compare(request, f"{flow}: no run was started",
            {n: "Workflow starting" not in r.output and "started (user:" not in r.output for n, r in runs.items()},
            True)
