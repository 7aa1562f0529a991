"""SlurmBackend without a cluster: check() against a recorded-style sinfo, cancel()'s order of scancels, logs()."""

from __future__ import annotations

import subprocess

import pytest

from stoker.backends.slurm import SlurmBackend, SlurmClient, SlurmOptions
from stoker.backends.slurm.backend import shared_reason
from stoker.errors import ConfigError
from stoker.runtime.contract import JobRef, Unit
from stoker.runtime.spec import TaskSpec

SINFO = "debug*|3|2|4000|(null)|up|infinite\nshort|2|8|16000|gpu:2|up|30:00\nold|1|2|4000|(null)|down|infinite\n"


class Runner:
    def __init__(self, answers: dict[str, tuple[int, str, str]] | None = None) -> None:
        self.answers = {"sinfo": (0, SINFO, ""), **(answers or {})}
        self.calls: list[list[str]] = []

    def __call__(self, args, **kw):
        self.calls.append(list(args))
        rc, out, err = next((v for k, v in self.answers.items() if " ".join(args).startswith(k)), (0, "", ""))
        return subprocess.CompletedProcess(args, rc, out, err)


def make(kind="task", n=1, **kw) -> Unit:
    specs = [TaskSpec(flow="F", run_id="1", step="train", task_id=str(i)) for i in range(n)]
    return Unit(kind=kind, flow="F", run_id="1", step="train", specs=specs, store_url="s3://b/p", **kw)


@pytest.fixture
def backend(tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_SHARED_PATHS", str(tmp_path))
    runner = Runner()
    b = SlurmBackend(SlurmOptions(log_dir=str(tmp_path / "logs")), client=SlurmClient(runner=runner, env={}),
                     sleep=lambda s: None)
    b.runner = runner
    return b


def test_check_partition_state_time_and_gpus(backend):
    backend.check(make(options={"partition": "short", "gpus_per_node": 2, "time": "20:00"}))
    with pytest.raises(ConfigError, match="is down"):
        backend.check(make(options={"partition": "old"}))
    with pytest.raises(ConfigError, match="over partition 'short'.s MaxTime 30:00"):
        backend.check(make(options={"partition": "short"}, timeout_s=3600))
    with pytest.raises(ConfigError, match="3 GPUs per node"):
        backend.check(make(options={"partition": "short", "gpus_per_node": "a100:3"}))
    assert [c[0] for c in backend.runner.calls] == ["sinfo"]
    caps = backend.capabilities()
    assert (caps.gpus, caps.cpus, caps.memory_mb) == (2, 8, 16000)


def test_check_without_a_default_partition(tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_SHARED_PATHS", str(tmp_path))
    b = SlurmBackend(SlurmOptions(log_dir=str(tmp_path)),
                     client=SlurmClient(runner=Runner({"sinfo": (0, "gpu|2|8|16000|gpu:2|up|infinite\n", "")})))
    with pytest.raises(ConfigError, match=r"no default partition: set @slurm\(partition=...\) to one of gpu"):
        b.check(make())


def test_check_log_dir_with_a_space(tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_SHARED_PATHS", str(tmp_path))
    b = SlurmBackend(SlurmOptions(log_dir=str(tmp_path / "my logs")), client=SlurmClient(runner=Runner()))
    with pytest.raises(ConfigError, match="space or '%'"):
        b.check(make())


def test_shared_reason(tmp_path):
    assert shared_reason(str(tmp_path / "a" / "b"), {"STOKER_SHARED_PATHS": f"/x:{tmp_path}"}) is None
    assert "STOKER_SHARED_PATHS is not set" in shared_reason(str(tmp_path), {})
    assert shared_reason(str(tmp_path) + "-other", {"STOKER_SHARED_PATHS": str(tmp_path)}) is not None


def test_cancel_pending_is_one_plain_scancel(backend):
    ref = JobRef(backend="slurm", job_id="7")
    backend.cancel(ref, grace=5)
    assert backend.runner.calls == [["scancel", "7"]]


def test_cancel_running_signals_then_cancels_after_the_grace(backend):
    ref = JobRef(backend="slurm", job_id="8")
    backend.runner.answers["scontrol"] = (0, "JobId=8 JobState=RUNNING Reason=None ExitCode=0:0 "
                                             "StartTime=2026-12-03T12:01:42 NodeList=n1\n", "")
    backend.runner.answers["sacct -n"] = (1, "", "Slurm accounting storage is disabled")
    assert backend.poll([ref])["8"].state == "running"
    backend.runner.calls.clear()
    backend.cancel(ref, grace=60)
    assert backend.runner.calls == [["scancel", "--signal=TERM", "--state=RUNNING", "8"]]
    backend.wait(0, lambda *a: None)
    assert len(backend.runner.calls) == 1  # the grace is still running
    backend.close()
    assert backend.runner.calls[-1] == ["scancel", "8"]


def test_cancel_with_no_grace(backend):
    backend.cancel(JobRef(backend="slurm", job_id="9"), grace=0)
    assert backend.runner.calls == [["scancel", "9"]]


def test_logs_read_the_member_and_batch_files(backend, tmp_path):
    ref = JobRef(backend="slurm", job_id="5", members=2, kind="gang", extra={"log_dir": str(tmp_path)})
    (tmp_path / "5-1.out").write_bytes(b"rank 1\n")
    (tmp_path / "5-0.err").write_bytes(b"oops\n")
    (tmp_path / "batch-5.err").write_bytes(b"srun: error: n2: task 1: Exited with exit code 1\n")
    assert backend.logs(ref, 1) == b"rank 1\n" and backend.logs(ref, 0) == b""
    assert backend.logs(ref, 0, "stderr") == b"oops\nsrun: error: n2: task 1: Exited with exit code 1\n"
    assert backend.logs(ref, 1, "stderr") == b""


def test_wait_feeds_whole_lines_of_started_members(backend, tmp_path):
    ref = JobRef(backend="slurm", job_id="6", members=1, extra={"log_dir": str(tmp_path)})
    backend.runner.answers["sacct -n"] = (0, "6|RUNNING|0:0|2026-12-03T12:01:42|n1|None\n", "")
    (tmp_path / "6-0.out").write_bytes(b"line 1\npart")
    got: list[bytes] = []
    backend.poll([ref])
    backend.wait(0, lambda r, m, s, d: got.append(d))
    assert got == [b"line 1\n"]
    backend.runner.answers["sacct -n"] = (0, "6|COMPLETED|0:0|2026-12-03T12:01:42|n1|None\n", "")
    st = backend.poll([ref])["6"]
    assert (st.state, st.exit_code, st.hosts) == ("exited", 0, ["n1"])
    backend.wait(0, lambda r, m, s, d: got.append(d))
    assert got == [b"line 1\n", b"part"] and not backend._tails


def test_a_pending_reason_that_never_clears_is_reported_as_blocked():
    from stoker.backends.slurm.client import SlurmRecord
    from stoker.backends.slurm.states import record_status

    waiting = record_status(SlurmRecord(job="7", state="PENDING", reason="Resources"))
    assert waiting.state == "queued" and not waiting.blocked
    stuck = record_status(SlurmRecord(job="7", state="PENDING", reason="BadConstraints"))
    assert stuck.blocked and "never start" in stuck.reason and "constraint" in stuck.reason


def test_sbatch_retries_a_busy_controller_then_reports_with_the_fix(monkeypatch):
    import stoker.backends.slurm.client as client

    monkeypatch.setattr(client, "TRANSIENT_WAITS", (0.0, 0.0, 0.0))
    busy = "sbatch: error: Batch job submission failed: Resource temporarily unavailable"
    calls = []

    def flaky(args, **kw):
        calls.append(args)
        ok = len(calls) == 2
        return subprocess.CompletedProcess(args, 0 if ok else 1, "42\n" if ok else "", "" if ok else busy)

    assert SlurmClient(runner=flaky, env={}).sbatch("#!/bin/bash\n") == "42" and len(calls) == 2
    calls.clear()
    never = Runner({"sbatch": (1, "", busy)})
    with pytest.raises(Exception, match="temporarily unavailable"):
        SlurmClient(runner=never, env={}).sbatch("#!/bin/bash\n")
    assert len([c for c in never.calls if c[0] == "sbatch"]) == 3
