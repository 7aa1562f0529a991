"""End-to-end runs through `python flow.py run/resume`, checked through the client API."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from stoker import Flow, Run, namespace
from tests.helpers import EXAMPLES, FLOWS, run_flow


def test_hello_example(tmp_path):
    p = run_flow(EXAMPLES / "hello.py", "run", cwd=tmp_path)
    assert "hello, world" in p.stdout
    run = Flow("HelloFlow").latest_run
    assert run.successful and run.finished
    assert run["hello"].task.data.message == "hello, world"
    assert run.data.greeting == "hello"
    assert "hello, world" in run["hello"].task.stdout


def test_foreach_example_fans_out_and_joins(tmp_path):
    run_flow(EXAMPLES / "foreach.py", "run", "--n", "6", cwd=tmp_path)
    run = Flow("ForeachFlow").latest_run
    squares = run["square"]
    tasks = sorted(squares, key=lambda t: t.index)
    assert [t.index for t in tasks] == list(range(6))
    assert [t.data.value for t in tasks] == [i * i for i in range(1, 7)]
    end = run["end"].task.data
    assert end.total_sum == sum(i * i for i in range(1, 7)) and end.biggest == 36
    assert end.numbers == list(range(1, 7))
    assert run.parameters["n"] == 6


def test_features_retry_catch_timeout_nested_foreach_configs(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("twelve chars")
    t0 = time.time()
    run_flow("features_flow.py", "run", "--notes", str(notes), "--set", "train.lr=0.5", cwd=tmp_path)
    assert time.time() - t0 < 30, "the 30 s sleep must have been cut by @timeout(seconds=1)"
    run = Flow("FeaturesFlow").latest_run
    d = run["end"].task.data
    assert d.env_value == "set-by-decorator"
    assert d.info["step"] == "start" and d.info["running"] is True and d.info["flow"] == "FeaturesFlow"
    assert d.info["run"] == run.id
    assert d.lr == 0.5, "--set overrides the Config"
    assert d.attempt_seen == 2 and d.branches == ["flaky", "safe"]
    assert "timed out after 1 s" in d.caught
    assert d.all_pairs == sorted([("a", 1, [0, 0]), ("a", 2, [0, 1]), ("b", 10, [1, 0]), ("b", 20, [1, 1]),
                                  ("b", 30, [1, 2])])
    assert d.arr.shape == (10, 100) and d.notes_len == 12 and d.shared == "same"
    flaky = run["flaky"].task
    assert flaky.retry_count == 2 and [a.successful for a in flaky.attempts] == [False, False, True]
    assert "flaky fails on attempt 0" in flaky.attempts[0].stderr
    assert run.config["cfg"]["train"]["lr"] == 0.5


def test_failed_run_exits_nonzero_and_resume_clones_what_succeeded(tmp_path):
    p = run_flow("resume_flow.py", "run", cwd=tmp_path, check=False)
    assert p.returncode == 1
    assert "work item 1 breaks" in p.stdout + p.stderr and "resume" in p.stdout
    first = Flow("ResumeFlow").latest_run
    assert not first.successful and first.finished
    run_flow("resume_flow.py", "resume", cwd=tmp_path, env={"RESUME_OK": "1"})
    second = Flow("ResumeFlow").latest_run
    assert second.id != first.id and second.successful and second.origin_run_id == first.id
    start = second["start"].task
    assert start.origin_pathspec == f"ResumeFlow/{first.id}/start/{first['start'].task.id}"
    assert start.data.start_pid == first["start"].task.data.start_pid, "start was cloned, not re-run"
    d = second["end"].task.data
    assert d.outs == [0, 10, 20] and d.origin == first.id
    # items 0 and 2 succeeded in the first run and were cloned; item 1 ran again in the resumed run
    assert d.work_runs[0] == first.id and d.work_runs[1] == second.id and d.work_runs[2] == first.id


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_gang_fails_fast_and_retries_as_a_unit(tmp_path, how):
    t0 = time.time()
    p = run_flow("gang_flow.py", "run", "--nodes", "3", "--fail-node", "1", "--how", how, cwd=tmp_path)
    assert time.time() - t0 < 30, "the other nodes sleep 60 s: they must have been stopped"
    assert "stopping the other 2 node(s)" in p.stdout
    run = Flow("GangFlow").latest_run
    assert run.successful
    d = run["end"].task.data
    assert d.nodes_seen == [0, 1, 2] and d.attempts == [1]
    tasks = list(run["work"])
    assert len(tasks) == 3 and all(t.retry_count == 1 for t in tasks)
    assert {t.data.num_nodes for t in tasks} == {3} and {t.data.main_ip for t in tasks} == {"127.0.0.1"}


def test_gang_failure_without_retry_reports_node_and_log_tail(tmp_path):
    flow = (FLOWS / "gang_flow.py").read_text().replace("    @retry(times=1, minutes_between_retries=0)\n", "")
    f = tmp_path / "gang_noretry.py"
    f.write_text(flow)
    t0 = time.time()
    p = run_flow(f, "run", "--nodes", "2", "--fail-node", "0", cwd=tmp_path, check=False)
    assert p.returncode == 1 and time.time() - t0 < 30
    out = p.stdout + p.stderr
    assert "gang node 0" in out and "node 0 fails on purpose" in out and "last lines of its log" in out
    assert not Flow("GangFlow").latest_run.successful


def test_concurrency_is_bounded_by_max_workers_and_resources(tmp_path):
    def max_overlap(spans):
        events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
        cur = best = 0
        for _, d in events:
            cur += d
            best = max(best, cur)
        return best

    run_flow("slow_foreach_flow.py", "run", "--n", "4", cwd=tmp_path)  # @resources(cpu=2): one at a time here
    spans = Flow("SlowForeachFlow").latest_run["end"].task.data.spans
    assert max_overlap(spans) == 1 if (os.cpu_count() or 1) < 4 else max_overlap(spans) <= (os.cpu_count() // 2)
    run_flow("slow_foreach_flow.py", "run", "--n", "6", "--max-workers", "3", "--with", "resources:cpu=0",
             cwd=tmp_path)
    spans = Flow("SlowForeachFlow").latest_run["end"].task.data.spans
    assert max_overlap(spans) <= 3


def test_ctrl_c_stops_every_task_and_marks_the_run(tmp_path):
    proc = subprocess.Popen([sys.executable, str(FLOWS / "sleepy_flow.py"), "run"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 30
    line = ""
    while "napping" not in line and time.time() < deadline:
        line = proc.stdout.readline()
    assert "napping" in line
    children = psutil.Process(proc.pid).children(recursive=True)
    assert children
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=20) == 130
    time.sleep(0.5)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    run = Flow("SleepyFlow").latest_run
    assert not run.successful and run.status == "killed"


def test_parameters_are_validated_before_anything_runs(tmp_path):
    p = run_flow(EXAMPLES / "foreach.py", "run", "--n", "many", cwd=tmp_path, check=False)
    assert p.returncode == 1 and "parameter --n: 'many' is not a valid int" in p.stderr
    assert "Traceback" not in p.stderr
    p = run_flow("features_flow.py", "run", "--notes", str(tmp_path / "missing.txt"), cwd=tmp_path, check=False)
    assert p.returncode == 1 and "no such file" in p.stderr
    p = run_flow("features_flow.py", "run", "--set", "nosuch.lr=1", cwd=tmp_path, check=False)
    assert p.returncode == 1 and "no section 'nosuch'" in p.stderr
    p = run_flow("features_flow.py", "run", "--with", "retri:times=1", cwd=tmp_path, check=False)
    assert p.returncode == 1 and "unknown decorator 'retri'" in p.stderr


def test_namespaces_follow_the_user(tmp_path):
    run_flow(EXAMPLES / "hello.py", "run", cwd=tmp_path, env={"USER": "alice"})
    namespace("user:alice")
    try:
        assert Flow("HelloFlow").latest_run.user == "alice"
        namespace("user:bob")
        assert Flow("HelloFlow").latest_run is None
        namespace(None)
        assert Flow("HelloFlow").latest_run is not None
    finally:
        from stoker.client.namespaces import default_namespace

        namespace(default_namespace())


def test_stoker_cli_lists_runs_and_prints_logs(tmp_path):
    run_flow(EXAMPLES / "hello.py", "run", cwd=tmp_path)
    run = Flow("HelloFlow").latest_run
    p = subprocess.run([sys.executable, "-m", "stoker.cli.main", "runs", "HelloFlow"], capture_output=True,
                       text=True, cwd=tmp_path)
    assert p.returncode == 0 and run.id in p.stdout and "succeeded" in p.stdout
    p = subprocess.run([sys.executable, "-m", "stoker.cli.main", "logs", f"HelloFlow/{run.id}/hello"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0 and "hello, world" in p.stdout
    p = subprocess.run([sys.executable, "-m", "stoker.cli.main", "logs", f"HelloFlow/{run.id}/hello", "--stdout"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0 and "hello, world" in p.stdout
    p = subprocess.run([sys.executable, "-m", "stoker.cli.main", "logs", f"HelloFlow/{run.id}/hello", "--stderr"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0 and "hello, world" not in p.stdout
    p = subprocess.run([sys.executable, "-m", "stoker.cli.main", "show", f"HelloFlow/{run.id}"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0 and "message" in p.stdout and "hello" in p.stdout
    p = subprocess.run([sys.executable, "-m", "stoker.cli.main", "show", "HelloFlow/123"], capture_output=True,
                       text=True, cwd=tmp_path)
    assert p.returncode == 1 and "Traceback" not in p.stderr


def test_run_objects_by_pathspec(tmp_path):
    run_flow(EXAMPLES / "hello.py", "run", cwd=tmp_path)
    run = Flow("HelloFlow").latest_successful_run
    same = Run(f"HelloFlow/{run.id}")
    assert same.id == run.id and [s.id for s in same] == ["end", "hello", "start"] or \
        sorted(s.id for s in same) == ["end", "hello", "start"]


def test_numpy_and_torch_artifacts_round_trip_through_steps(tmp_path):
    import numpy as np
    import torch

    run_flow("tensor_flow.py", "run", cwd=tmp_path)
    run = Flow("TensorFlow").latest_run
    d = run["end"].task.data
    assert d.half.dtype == torch.bfloat16 and d.view.shape == (10, 10)
    assert np.isclose(d.total, float(d.array.sum()))
    assert torch.equal(d.view, torch.arange(100.0).reshape(10, 10).t())


def test_subprocess_launch_mode_runs_the_same_task_entrypoint(tmp_path):
    """STOKER_TASK_LAUNCH=subprocess runs `python flow.py _task SPEC`, as cluster backends do."""
    run_flow(EXAMPLES / "foreach.py", "run", "--n", "3", cwd=tmp_path, env={"STOKER_TASK_LAUNCH": "subprocess"})
    run = Flow("ForeachFlow").latest_run
    assert run.successful and run["end"].task.data.total_sum == 14
    assert len({t.data.value for t in run["square"]}) == 3


def test_edge_cases_of_graph_parsing_artifacts_and_join_inputs(tmp_path):
    run_flow("edge_flow.py", "run", cwd=tmp_path)
    run = Flow("EdgeFlow").latest_run
    d = run["end"].task.data
    assert d.seen == [(0, "a", "a"), (1, "b", "b"), (2, "c", "c")]
    assert d.doubled == [20, 40] and d._private == "kept"
    assert run["start"].task.data.failure is None, "@catch sets its variable to None when nothing failed"


def test_assigning_a_parameter_names_the_problem(tmp_path):
    p = run_flow("edge_flow.py", "run", "--mode", "assign-param", cwd=tmp_path, check=False)
    out = p.stdout + p.stderr
    assert p.returncode == 1, "@catch does not apply to a foreach split: the run fails"
    assert "mode is a run input (Parameter/Config) and is read-only" in out


def test_a_failing_branch_stops_a_running_gang_and_the_run_is_marked(tmp_path):
    flow = tmp_path / "gang_branch.py"
    flow.write_text('''
import sys, time
from stoker import FlowSpec, current, parallel, retry, step

class GangBranchFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.a, self.b)

    @step
    def a(self):
        self.next(self.g, num_parallel=2)

    @retry(times=1, minutes_between_retries=0)
    @parallel
    @step
    def g(self):
        if current.parallel.node_index == 1 and current.retry_count == 0:
            sys.exit(1)
        time.sleep(30)
        self.next(self.gj)

    @step
    def gj(self, inputs):
        self.next(self.j)

    @step
    def b(self):
        time.sleep(2)
        if True:
            raise RuntimeError("branch b fails")
        self.next(self.j)

    @step
    def j(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass

if __name__ == "__main__":
    GangBranchFlow()
''')
    t0 = time.time()
    p = run_flow(flow, "run", cwd=tmp_path, check=False)
    assert p.returncode == 1 and "Traceback (most recent call last)" not in p.stderr.split("branch b fails")[-1]
    assert time.time() - t0 < 30 and "branch b fails" in p.stdout + p.stderr
    run = Flow("GangBranchFlow").latest_run
    assert run.status == "failed"


GANG_NODE_ENDS_WELL = '''
import signal, sys, time
from stoker import FlowSpec, current, parallel, retry, step

class LateNodeFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.g, num_parallel=2)

    @retry(times=1, minutes_between_retries=0)
    @parallel
    @step
    def g(self):
        if current.parallel.node_index == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # it ends well after the gang's stop reached it
            time.sleep(1.5)
        elif current.retry_count == 0:
            time.sleep(0.3)
            sys.exit(1)
        self.node = current.parallel.node_index
        self.next(self.join)

    @step
    def join(self, inputs):
        self.nodes = sorted(i.node for i in inputs)
        self.next(self.end)

    @step
    def end(self):
        pass

if __name__ == "__main__":
    LateNodeFlow()
'''


def test_a_gang_node_that_ends_well_after_another_failed_still_gets_the_gang_retried(tmp_path):
    """Node 1 fails; node 0 is stopped but ends well (its step ignores SIGTERM) after node 1's failure: the gang is
    retried as one (it once ended the run as failed, with no message and no retry)."""
    flow = tmp_path / "late_node.py"
    flow.write_text(GANG_NODE_ENDS_WELL)
    p = run_flow(flow, "run", cwd=tmp_path, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    run = Flow("LateNodeFlow").latest_run
    assert run.successful and run["join"].task.data.nodes == [0, 1]
    assert "the gang retry 1 of 1" in p.stdout + p.stderr
