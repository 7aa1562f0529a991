"""The next backend needs no scheduler change: a backend that implements only the contract runs a foreach
and a gang (with a failing node, a gang retry and fail-fast) through the remote path: code package, spec
blob, `python -m stoker.runtime.node`, logs uploaded by the task."""

from __future__ import annotations

import importlib.util
import sys
import time

import pytest

from stoker import Flow
from stoker.runtime.contract import EXITED, QUEUED, JobRef, JobStatus
from stoker.runtime.driver.launch import start_run
from tests.contract_backend import ProcessBackend
from tests.helpers import EXAMPLES, FLOWS

pytestmark = pytest.mark.slow


def _flow_class(path, name):
    spec = importlib.util.spec_from_file_location(f"flowmod_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return getattr(mod, name)


def test_foreach_on_a_contract_only_backend(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    backend = ProcessBackend()
    cls = _flow_class(EXAMPLES / "foreach.py", "ForeachFlow")
    result = start_run(cls, lambda step: backend, params={"n": "5"}, quiet=True)
    assert result.status == "succeeded", result.failures
    run = Flow("ForeachFlow")[result.run_id]
    assert run["end"].task.data.total_sum == sum(i * i for i in range(1, 6))
    squares = sorted(run["square"], key=lambda t: t.index)
    assert [t.data.value for t in squares] == [i * i for i in range(1, 6)]
    assert "^2 =" in squares[0].stdout, "the member uploaded its own log to the store"
    kinds = [r.unit.kind for r in backend.submitted]
    assert kinds.count("task") == len(kinds), "a backend without arrays gets one unit per task"
    keys = {r.unit.code_key for r in backend.submitted}
    assert len(keys) == 1 and None not in keys, "one code package per run"


def test_gang_fails_fast_and_retries_as_a_unit(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    backend = ProcessBackend()
    cls = _flow_class(FLOWS / "gang_flow.py", "GangFlow")
    t0 = time.time()
    result = start_run(cls, lambda step: backend, params={"nodes": "2", "fail_node": "1"}, quiet=True)
    assert result.status == "succeeded", result.failures
    assert time.time() - t0 < 40, "node 0 sleeps 60 s on attempt 0: the gang must have been stopped"
    gangs = [r for r in backend.submitted if r.unit.kind == "gang"]
    assert len(gangs) == 2 and [g.unit.attempt for g in gangs] == [0, 1], "one submission per gang attempt"
    assert all(g.unit.size == 2 for g in gangs)
    run = Flow("GangFlow")[result.run_id]
    assert run["join"].task.data.nodes_seen == [0, 1] and run["join"].task.data.attempts == [1]
    work = sorted(run["work"], key=lambda t: t.data.node)
    assert all(t.data.main_ip == "127.0.0.1" for t in work), "main address from the engine's environment"
    first = [a for a in work[1].attempts if not a.successful][0]
    assert "fails on purpose" in first.stderr


class ArrayBackend(ProcessBackend):
    arrays = True


def test_an_array_element_retried_while_its_siblings_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    backend = ArrayBackend()
    cls = _flow_class(FLOWS / "array_retry_flow.py", "ArrayRetryFlow")
    result = start_run(cls, lambda step: backend, quiet=True)
    assert result.status == "succeeded", result.failures
    run = Flow("ArrayRetryFlow")[result.run_id]
    assert run["join"].task.data.values == [0, 10, 20]
    work = [r.unit for r in backend.submitted if r.unit.step == "work"]
    assert [(u.kind, u.size, u.attempt) for u in work] == [("array", 3, 0), ("task", 1, 1)]
    assert work[0].throttle == 16, "the engine runs at most --max-workers elements at once"


class NeverStarts(ProcessBackend):
    """An engine that queues a job it can never start (Slurm's BadConstraints, InvalidAccount ...)."""

    name = "never"

    def submit(self, request):
        self.submitted.append(request)
        self.cancelled = []
        unit = request.unit
        return JobRef(self.name, f"q{len(self.submitted)}", members=unit.size, kind=unit.kind, step=unit.step,
                      task_ids=[s.task_id for s in unit.specs], attempt=unit.attempt)

    def poll(self, refs):
        return {r.job_id: (JobStatus(EXITED, exit_code=-15) if r.job_id in self.cancelled else
                           JobStatus(QUEUED, reason="BadConstraints: no node has the feature", blocked=True))
                for r in refs}

    def cancel(self, ref, grace=3.0, member=None):
        self.cancelled.append(ref.job_id)

    def logs(self, ref, member=0, stream="stdout"):
        return b""


def test_a_job_the_engine_can_never_start_fails_fast_without_retries(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    backend, here = NeverStarts(), ProcessBackend()
    cls = _flow_class(FLOWS / "gang_flow.py", "GangFlow")  # work has @retry(times=1)
    t0 = time.time()
    result = start_run(cls, lambda step: backend if step == "work" else here, params={"nodes": "2"}, quiet=True)
    assert result.status == "failed" and time.time() - t0 < 20
    assert len(backend.submitted) == 1, "not retried: waiting or resubmitting cannot help"
    assert backend.cancelled == ["q1"], "the queued job was cancelled, not left behind"
    assert "can never start it" in result.failures[0] and "BadConstraints" in result.failures[0]


class SlowQueue(ProcessBackend):
    """An engine whose queue holds every job for QUEUE_S before it starts it."""

    name = "slowqueue"
    QUEUE_S = 9.0

    def submit(self, request):
        self.submitted.append(request)
        unit = request.unit
        ref = JobRef(self.name, f"s{len(self.submitted)}", members=unit.size, kind=unit.kind, step=unit.step,
                     task_ids=[s.task_id for s in unit.specs], attempt=unit.attempt,
                     extra={"store": unit.store_url, "flow": unit.flow, "run_id": unit.run_id})
        self.pending = getattr(self, "pending", {})
        self.pending[ref.job_id] = (time.time() + self.QUEUE_S, request)
        return ref

    def poll(self, refs):
        out = {}
        for r in refs:
            due, request = self.pending.get(r.job_id, (0, None))
            if request is not None and time.time() < due:
                out[r.job_id] = JobStatus(QUEUED)
                continue
            if request is not None:  # the engine starts it now
                del self.pending[r.job_id]
                started = super().submit(request)
                self.procs[r.job_id] = self.procs.pop(started.job_id)
                r.submitted_at = time.time()
            out.update(super().poll([r]))
        return out


def test_timeout_counts_from_the_start_not_the_submission(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    backend, here = SlowQueue(), ProcessBackend()
    cls = _flow_class(FLOWS / "timeout_flow.py", "TimeoutFlow")
    result = start_run(cls, lambda step: backend if step == "nap" else here, quiet=True)
    assert result.status == "succeeded", result.failures  # 9 s queued + 1 s run, under @timeout(seconds=2)
    assert Flow("TimeoutFlow")[result.run_id]["nap"].task.data.slept
