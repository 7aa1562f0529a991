"""Client objects in a run: sibling tasks' tag changes, a stored Task, steps(*tags), control_tasks, gang workers.

Issue 28, items 5, 6 and 8: sibling tasks changing one run's tags, a Task stored as an artifact, `Run.steps(*tags)`,
`Step.control_tasks()`, gang worker nodes that return before `self.next()`, and the header line `tag list --flat`
prints first."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.compat.conftest import compare, outputs
from tests.compat.engines import run_flow

pytestmark = pytest.mark.slow

FLOW = "client_objects_flow.py"


def _ok(request, runs):
    compare(request, "exit status", {n: r.proc.returncode for n, r in runs.items()}, 0)


def test_sibling_tasks_change_tags(both, request):
    """Foreach siblings add and remove the same run tags; each sees its own change (Metaflow's TagMutationTest)."""
    runs = both(FLOW)
    _ok(request, runs)
    got = {n: r.client("""
        from metaflow import Flow
        run = Flow("ClientObjectsFlow").latest_run
        result = {"all_ok": run["join"].task.data.all_ok, "user_tags": sorted(run.user_tags)}
    """) for n, r in runs.items()}
    compare(request, "every task saw its own tag changes; none are left", got,
            {"all_ok": True, "user_tags": []}), outputs(runs)


def test_task_stored_as_artifact(both, request):
    """A Task stored as an artifact pickles (what identifies it) and reconnects when a later step loads it."""
    runs = both(FLOW)
    got = {n: r.client("""
        from metaflow import Flow
        run = Flow("ClientObjectsFlow").latest_run
        t = run["join"].task.data.start_task
        result = {"items": run.data.start_items, "step": run.data.start_step, "type": type(t).__name__,
                  "same": t.pathspec == run["start"].task.pathspec, "data": t.data.items}
    """) for n, r in runs.items()}
    compare(request, "the stored Task", got, {"items": [0, 1, 2, 3], "step": "start", "type": "Task",
                                              "same": True, "data": [0, 1, 2, 3]})


def test_steps_filtered_by_tags(both, request):
    """`Run.steps(*tags)`: the steps carrying every tag given (a step carries its run's tags)."""
    runs = both(FLOW)
    got = {n: r.client("""
        from metaflow import Flow
        run = Flow("ClientObjectsFlow").latest_run
        result = {"all": [s.id for s in run.steps()], "user": [s.id for s in run.steps("user:tester")],
                  "none": [s.id for s in run.steps("user:tester", "no-such-tag")],
                  "tasks": [len(list(s.tasks("no-such-tag"))) for s in run.steps()]}
    """) for n, r in runs.items()}
    steps = ["end", "join", "mutate", "start"]
    compare(request, "steps by tags", got, {"all": steps, "user": steps, "none": [], "tasks": [0, 0, 0, 0]})


def test_tag_list_flat_header(both, request):
    """`tag list --flat`: on stderr, the engine's header line first, then one tag a line."""
    runs = both(FLOW)
    got = {}
    for n, r in runs.items():
        rid = r.client('from metaflow import Flow\nresult = Flow("ClientObjectsFlow").latest_run.id')
        add = run_flow(r.engine, FLOW, r.folder, "add", "--run-id", rid, "flat-one", command="tag", home=r.home)
        p = run_flow(r.engine, FLOW, r.folder, "list", "--flat", rid, command="tag", home=r.home).proc
        lines = p.stderr.splitlines()
        got[n] = {"rc": [add.proc.returncode, p.returncode], "stdout": p.stdout,
                  "header": bool(lines) and lines[0].endswith(" executing ClientObjectsFlow for user:tester"),
                  "tags": sorted(ln for ln in lines[1:] if ln in ("flat-one", "user:tester"))}
    compare(request, "header, then the tags", got, {"rc": [0, 0], "stdout": "", "header": True,
                                                    "tags": ["flat-one", "user:tester"]})


@pytest.fixture(scope="module")
def gang(both, engines):
    # Metaflow's local gang runs its other nodes with the `python` on PATH: make it the engine's own
    path = os.pathsep.join([str(Path(engines["metaflow"].python).parent), os.environ.get("PATH", "")])
    return both("gang_next_flow.py", env={"PATH": path})


def test_gang_workers_return_early(gang, request):
    """Gang worker nodes that return before self.next() are tolerated; the join sees every node."""
    _ok(request, gang)
    got = {n: r.client("""
        from metaflow import Flow
        result = Flow("GangNextFlow").latest_run.data.nodes
    """) for n, r in gang.items()}
    compare(request, "the join's inputs", got, [0, 1, 2]), outputs(gang)


def test_control_tasks(gang, request):
    """`Step.control_tasks()`: a gang step's control task (node 0); with a tag the run lacks, none."""
    got = {n: r.client("""
        from metaflow import Flow
        run = Flow("GangNextFlow").latest_run
        ctl = list(run["gang"].control_tasks())
        result = {"nodes": [t.data.node for t in ctl], "tasks": len(list(run["gang"])),
                  "tagged": len(list(run["gang"].control_tasks("user:tester"))),
                  "other_tag": len(list(run["gang"].control_tasks("no-such-tag"))),
                  "start": len(list(run["start"].control_tasks()))}
    """) for n, r in gang.items()}
    compare(request, "control tasks", got, {"nodes": [0], "tasks": 3, "tagged": 1, "other_tag": 0, "start": 0})
