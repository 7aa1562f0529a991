"""@catch: tasks whose process died (SIGKILL, a segfault) are caught too, a gang node killed included, and the flow
goes on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.compat.conftest import compare, outputs

pytestmark = pytest.mark.slow

FALLBACK = ("Task execution kept failing over {} attempts. Your code did not raise an exception. Something in "
            "the execution environment caused the failure.")


def test_catch_dead_process(both, request):
    """@catch stores FailureHandledByCatch for a task SIGKILLed (after its @retry) or segfaulted; the flow goes on."""
    runs = both("catch_crash_flow.py")
    compare(request, "exit status", {n: r.proc.returncode for n, r in runs.items()}, 0)
    got = {n: r.client('''
        from metaflow import Flow
        run = Flow("CatchCrashFlow").latest_run
        result = {"caught": run.data.caught, "partial_kept": run.data.partial_kept, "base": run.data.base_kept}
    ''') for n, r in runs.items()}

    def ok(v: dict) -> bool:
        c = v["caught"]
        return all(c[s][0].endswith(".FailureHandledByCatch") and c[s][1] == FALLBACK.format(n)
                   for s, n in (("killed", 2), ("segv", 1))) \
            and c["raised"] == ["builtins.ValueError", "boom"] and v["partial_kept"] is False and v["base"] == 1

    compare(request, "what @catch stored, per branch", got, check=ok)
    assert ok(got["stoker"]), outputs(runs)


def test_catch_fallback_is_a_new_attempt(both, request):
    """A dead task's fallback is the attempt after its own 1 + @retry times; a raised exception is caught at once."""
    runs = both("catch_crash_flow.py")
    got = {n: r.client('''
        from metaflow import Flow, Task
        run = Flow("CatchCrashFlow").latest_run
        result = {s: [run[s].task.current_attempt, Task(run[s].task.pathspec, attempt=0).successful]
                  for s in ("killed", "segv", "raised")}
    ''') for n, r in runs.items()}
    compare(request, "[latest attempt, attempt 0 successful] per step", got,
            check=lambda v: v["killed"] == [2, False] and v["segv"] == [1, False] and v["raised"][0] == 0)


def test_crashed_task_log_says_why(both, request):
    """The stderr of a task whose process died says so (a segfault is named as one)."""
    runs = both("catch_crash_flow.py")
    got = {n: r.client('''
        from metaflow import Flow, Task
        run = Flow("CatchCrashFlow").latest_run
        result = {s: Task(run[s].task.pathspec, attempt=0).stderr for s in ("killed", "segv")}
    ''') for n, r in runs.items()}
    compare(request, "attempt 0's stderr says the task failed, and a segfault is named",
            got, check=lambda v: "Task failed" in v["killed"] and "segmentation fault" in v["segv"])
    assert "killed by signal SIGKILL" in got["stoker"]["killed"] and "SIGSEGV" in got["stoker"]["segv"]
    assert "Fatal Python error: Segmentation fault" in got["stoker"]["segv"]  # faulthandler: where it crashed


def test_catch_killed_gang_node(both, engines, request):
    """A gang node SIGKILLed on every attempt: @catch records the failure and the flow goes on. Metaflow's local gang
    catches it in its control task ("Subprocess failed, return code -9") and its join sees that task alone; stoker's
    gang falls back as one (each node records FailureHandledByCatch), so its join sees every node, each caught."""
    # Metaflow's local gang runs its other nodes with the `python` on PATH: make it the engine's own
    path = os.pathsep.join([str(Path(engines["metaflow"].python).parent), os.environ.get("PATH", "")])
    runs = both("gang_catch_flow.py", env={"PATH": path})
    compare(request, "exit status", {n: r.proc.returncode for n, r in runs.items()}, 0)
    got = {n: r.client('''
        from metaflow import Flow
        run = Flow("GangCatchFlow").latest_run
        result = {"successful": run.successful, "all_caught": run["join"].task.data.all_caught,
                  "inputs": run["join"].task.data.inputs_seen}
    ''') for n, r in runs.items()}
    compare(request, "the run succeeded and every input of the join has the failure in `failure`", got,
            check=lambda v: v["successful"] and v["all_caught"] and v["inputs"] >= 1)
    assert got["metaflow"]["inputs"] == 1 and got["stoker"]["inputs"] == 2, got  # the documented difference
