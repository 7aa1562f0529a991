"""Client API: task lineage, logs, metadata, tags, exceptions, origin pathspecs, metadata and namespace switches."""

from __future__ import annotations

import subprocess

import pytest

from tests.compat.conftest import compare, outputs
from tests.compat.engines import FLOWS, FlowRun, run_flow

pytestmark = pytest.mark.slow

FLOW = "client_api_flow.py"
PRELUDE = """
from metaflow import Flow
run = Flow("ClientApiFlow").latest_run
def steps(tasks):
    return sorted(t.pathspec.split("/")[2] for t in tasks)
"""


def _ok(request, runs):
    compare(request, "exit status", {n: r.proc.returncode for n, r in runs.items()}, 0)


def test_task_lineage(both, request):
    """Task.parent_tasks and Task.child_tasks follow foreach fan-out, joins and branches."""
    runs = both(FLOW)
    _ok(request, runs)
    got = {n: r.client(PRELUDE + """
result = {s.id: {"parents": steps(s.task.parent_tasks), "children": steps(s.task.child_tasks)} for s in run}
result["fan_tasks"] = [{"parents": steps(t.parent_tasks), "children": steps(t.child_tasks)} for t in run["fan"]]
""") for n, r in runs.items()}
    compare(request, "parent and child tasks by step", got)
    assert got["stoker"]["gather"]["parents"] == ["fan", "fan"], outputs(runs)


def test_step_lineage(both, request):
    """Step.parent_steps and Step.child_steps follow the flow's graph."""
    runs = both(FLOW)
    got = {n: r.client(PRELUDE + """
result = {s.id: {"parents": sorted(p.id for p in s.parent_steps), "children": sorted(c.id for c in s.child_steps)}
          for s in run}
""") for n, r in runs.items()}
    compare(request, "parent and child steps", got)
    assert got["stoker"]["split"]["children"] == ["left", "right"]


def test_loglines(both, request):
    """Task.loglines(stream) yields (datetime, line) tuples; stdout and stderr hold what the step printed."""
    runs = both(FLOW)
    got = {n: r.client(PRELUDE + """
import datetime
t = run["start"].task
out, err = list(t.loglines("stdout")), list(t.loglines("stderr"))
result = {"stdout": [l for _, l in out], "stderr": [l for _, l in err],
          "stamps": all(isinstance(ts, datetime.datetime) for ts, _ in out + err),
          "text": t.stdout, "end": list(l for _, l in run["end"].task.loglines("stdout"))}
""") for n, r in runs.items()}
    compare(request, "log lines", got, {"stdout": ["hello from start"], "stderr": ["warning from start"],
                                        "stamps": True, "text": "hello from start\n", "end": ["the end"]})


def test_metadata(both, request):
    """Task.metadata and metadata_dict carry Metaflow's keys (attempt, origin-run-id, user, attempt_ok, ...)."""
    runs = both(FLOW)
    got = {n: r.client(PRELUDE + """
keys = ["attempt", "origin-run-id", "user", "runtime", "ds-type", "script-name", "attempt_ok", "attempt-done"]
t = run["start"].task
md = t.metadata_dict
ms = t.metadata
fan = sorted(t.metadata_dict.get("foreach-execution-path") for t in run["fan"])
result = {"dict": {k: md.get(k) for k in keys}, "fan_paths": fan,
          "no_path_outside_foreach": "foreach-execution-path" not in md,
          "fields": sorted(ms[0]._fields), "typed": all(isinstance(m.created_at, int) for m in ms),
          "task": ms[0].task.pathspec == t.pathspec, "current_attempt": t.current_attempt,
          "attempt_meta": Flow("ClientApiFlow").latest_run["start"].task.metadata_dict["attempt"]}
""") for n, r in runs.items()}
    compare(request, "metadata of a task", got, {
        "dict": {"attempt": "0", "origin-run-id": "None", "user": "tester", "runtime": "dev", "ds-type": "local",
                 "script-name": FLOW, "attempt_ok": "True", "attempt-done": "0"},
        "fan_paths": ["fan:0", "fan:1"], "no_path_outside_foreach": True,
        "fields": ["created_at", "name", "task", "type", "value"], "typed": True, "task": True,
        "current_attempt": 0, "attempt_meta": "0"})


def test_tags(both, request):
    """Run.add_tag/add_tags/remove_tag/remove_tags/replace_tag/replace_tags with Metaflow's validation."""
    runs = both(FLOW)
    got = {n: r.client(PRELUDE + """
from metaflow import Run
def raises(fn):
    try:
        fn()
    except Exception as e:
        return str(e)
    return None
r = Run(run.pathspec)
steps_ = []
r.add_tag("a"); steps_.append(sorted(r.user_tags))
r.add_tags(["b", "c"]); steps_.append(sorted(r.user_tags))
r.remove_tag("a"); steps_.append(sorted(r.user_tags))
r.replace_tag("b", "d"); steps_.append(sorted(r.user_tags))
r.replace_tags(["c", "d"], ["e", "f"]); steps_.append(sorted(r.user_tags))
r.remove_tags(["e", "f", "never-there"]); steps_.append(sorted(r.user_tags))
r.add_tag("user:tester"); steps_.append(sorted(r.user_tags))
errors = {"system": raises(lambda: r.remove_tag("user:tester")), "empty": raises(lambda: r.add_tag("")),
          "long": raises(lambda: r.add_tag("x" * 501)), "nothing": raises(lambda: r.replace_tags([], [])),
          "string": raises(lambda: r.remove_tags("abc")), \
"too_many": raises(lambda: r.add_tags(["t%d" % i for i in range(51)]))}
result = {"steps": steps_, "raised": {k: v is not None for k, v in errors.items()},
          "system_msg": "system tag" in (errors["system"] or ""), "long_msg": "too long" in (errors["long"] or ""),
          "flow_tags": sorted(Flow("ClientApiFlow").tags), "user_tag_in_system": "user:tester" in r.system_tags,
          "fresh": sorted(Run(run.pathspec).user_tags), "task_tags": "user:tester" in run["start"].task.tags}
""") for n, r in runs.items()}
    compare(request, "tags after each change, and refusals", got, {
        "steps": [["a"], ["a", "b", "c"], ["b", "c"], ["c", "d"], ["e", "f"], [], []],
        "raised": {"system": True, "empty": True, "long": True, "nothing": True, "string": True, "too_many": True},
        "system_msg": True, "long_msg": True, "flow_tags": [], "user_tag_in_system": True, "fresh": [],
        "task_tags": True})


def test_task_exception(both, request):
    """Task.exception of a failed task has Metaflow's .type, .exception and .stacktrace; @catch leaves it None."""
    runs = both(FLOW, env={"CLIENT_API_FAIL": "1"}, key="failing")
    compare(request, "a failing run exits non-zero", {n: r.proc.returncode != 0 for n, r in runs.items()}, True)
    got = {n: r.client(PRELUDE + """
e = run["right"].task.exception
caught = run["left"].task
result = {"type": e.type, "exception": e.exception, "trace": "right failed on purpose" in e.stacktrace,
          "str_is_trace": str(e) == e.stacktrace, "caught": caught.exception is None,
          "failure": [caught.data.failure.type, caught.data.failure.exception],
          "ok": run["right"].task.successful}
""") for n, r in runs.items()}
    compare(request, "the exception of a failed task", got, {
        "type": "builtins.ValueError", "exception": "right failed on purpose", "trace": True, "str_is_trace": True,
        "caught": True, "failure": ["builtins.ValueError", "left went wrong"], "ok": False})


def test_origin_pathspec(both, request):
    """After `resume`, Run/Step/Task.origin_pathspec and origin-run-id/origin-task-id name the resumed run."""
    runs = both(FLOW, env={"CLIENT_API_FAIL": "1"}, key="failing")
    resumed = {n: run_flow(r.engine, FLOW, r.folder, command="resume", home=r.home) for n, r in runs.items()}
    compare(request, "resume exit status", {n: r.proc.returncode for n, r in resumed.items()}, 0)
    got = {n: r.client("""
from metaflow import Flow
flow = Flow("ClientApiFlow")
new, old = list(flow)[:2]
start, right = new["start"].task, new["right"].task
result = {"run": new.origin_pathspec == old.pathspec, "step": new["start"].origin_pathspec == old.pathspec + "/start",
          "cloned_task": start.origin_pathspec == old["start"].task.pathspec,
          "rerun_task": right.origin_pathspec, "origin_run_id": start.metadata_dict.get("origin-run-id") == old.id,
          "origin_task_id": start.metadata_dict.get("origin-task-id") == old["start"].task.id,
          "rerun_origin_run_id": right.metadata_dict.get("origin-run-id") == old.id,
          "successful": new.successful}
""") for n, r in resumed.items()}
    compare(request, "origin pathspecs of a resumed run", got, {
        "run": True, "step": True, "cloned_task": True, "rerun_task": None, "origin_run_id": True,
        "origin_task_id": True, "rerun_origin_run_id": True, "successful": True})


def test_metadata_and_namespace_functions(both, request):
    """get_metadata/metadata/default_metadata and namespace/get_namespace/default_namespace, \
imported from the package."""
    runs = both(FLOW)
    got = {n: r.client(f"""
from metaflow import get_metadata, metadata, default_metadata, namespace, get_namespace, default_namespace, Flow
home = {str(r.home)!r}
result = {{"get": get_metadata() == "local@" + home, "set": metadata("local@" + home) == "local@" + home,
          "default": default_metadata() == "local@" + home, "ns": get_namespace(), "none": namespace(None),
          "global_sees": Flow("ClientApiFlow").latest_run is not None, "other": namespace("user:nobody"),
          "back": default_namespace(), "now": get_namespace()}}
""") for n, r in runs.items()}
    compare(request, "metadata and namespace functions", got, {
        "get": True, "set": True, "default": True, "ns": "user:tester", "none": None, "global_sees": True,
        "other": "user:nobody", "back": "user:tester", "now": "user:tester"})


def test_visible_while_running(engines, tmp_path, request):
    """A run and its running task are listed by the client while the task runs, with finished False."""
    got = {}
    for name, engine in engines.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "running_flow.py").write_text(engine.source((FLOWS / "running_flow.py").read_text()))
        home = folder / "home"
        proc = subprocess.Popen([engine.python, "running_flow.py", "--no-pylint", "run"], cwd=folder,
                                env=engine.env(home), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            fr = FlowRun(engine, folder, home, subprocess.CompletedProcess([], 0, "", ""))
            got[name] = fr.client("""
import time
from metaflow import Flow
result = None
for _ in range(300):
    try:
        run = Flow("RunningFlow").latest_run
        if run is not None and "wait" in run and run["wait"].task is not None:
            t = run["wait"].task
            result = {"run_finished": run.finished, "task_finished": t.finished, "task_successful": t.successful,
                      "steps": sorted(s.id for s in run), "tasks": len(list(run["wait"]))}
            break
    except Exception:
        pass
    time.sleep(0.2)
""")
        finally:
            (folder / "go.txt").write_text("go")
            out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0, out[-3000:]
    compare(request, "a running task as the client sees it", got, {
        "run_finished": False, "task_finished": False, "task_successful": False, "steps": ["start", "wait"],
        "tasks": 1})
