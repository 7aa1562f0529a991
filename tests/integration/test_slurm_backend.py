"""The Slurm backend against the real localhost cluster (tests/slurm_cluster.py: n1..n3, 2 CPUs and 4000 MB
each, partition `debug`). Members run a tiny `python -c` instead of the task entrypoint."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stoker.backends.slurm import SlurmBackend, SlurmClient, SlurmOptions
from stoker.errors import ConfigError
from stoker.runtime.contract import EXITED, JobRef, JobStatus, Unit
from stoker.runtime.spec import TaskSpec

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(120)]

WHO = ("import os, sys, time; m = int(os.environ.get('SLURM_ARRAY_TASK_ID') or os.environ['SLURM_NODEID']); "
       "print(f\"member {m} on {os.environ['SLURMD_NODENAME']} main {os.environ.get('STOKER_MAIN_ADDR')}\", "
       "flush=True); ")


@dataclasses.dataclass(kw_only=True)
class CmdUnit(Unit):
    """A unit whose members run `command` instead of the task entrypoint."""

    command: list[str] = dataclasses.field(default_factory=list)

    def node_command(self, python: str | None = None, module: str = "") -> list[str]:
        return self.command


class CountingRunner:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, args, **kw):
        self.calls.append(list(args))
        return subprocess.run(args, **kw)


def unit(kind: str, n: int, code: str, step: str = "s", **kw) -> CmdUnit:
    specs = [TaskSpec(flow="SlurmTest", run_id=str(time.time_ns()), step=step, task_id=str(i)) for i in range(n)]
    return CmdUnit(kind=kind, flow="SlurmTest", run_id=specs[0].run_id, step=step, specs=specs,
                   command=[sys.executable, "-c", WHO + code], **kw)


@pytest.fixture
def backend(slurm_cluster, tmp_path):
    runner = CountingRunner()
    b = SlurmBackend(SlurmOptions(log_dir=str(tmp_path / "slurm-logs"), poll_interval=0.2),
                     client=SlurmClient(runner=runner))
    b.runner = runner
    yield b
    b.close()


def run_until_exited(b: SlurmBackend, refs: list[JobRef], timeout: float = 60, output: dict | None = None,
                     on_running=None) -> tuple[dict[str, JobStatus], dict[str, dict[str, float]]]:
    """Poll (one call for all) until every ref has exited; returns the last statuses and when each state was
    first seen, in seconds after the call."""
    t0, seen, last = time.monotonic(), {r.job_id: {} for r in refs}, {}

    def sink(ref, member, stream, data):
        if output is not None:
            output.setdefault((ref.job_id, member, stream), bytearray()).extend(data)

    while time.monotonic() - t0 < timeout:
        last = b.poll(refs)
        for job, st in last.items():
            if st.state not in seen[job]:
                seen[job][st.state] = round(time.monotonic() - t0, 2)
                if st.state == "running" and on_running:
                    on_running(job)
        if len(last) == len(refs) and all(st.state == EXITED for st in last.values()):
            b.wait(0, sink)  # drain the last output
            return last, seen
        b.wait(b.poll_interval, sink)
    raise AssertionError(f"not exited after {timeout}s: {last}")


def test_exit_codes_start_time_hosts_and_logs(backend):
    refs = [backend.submit(backend.materialize(unit("task", 1, f"sys.exit({c})"))) for c in (0, 3)]
    st, seen = run_until_exited(backend, refs)
    ok, bad = st[refs[0].job_id], st[refs[1].job_id]
    assert (ok.exit_code, bad.exit_code) == (0, 3) and ok.reason is None and bad.reason is None
    assert ok.hosts and ok.hosts[0] in ("n1", "n2", "n3") and abs(ok.started_at - time.time()) < 60
    assert backend.logs(refs[1], 0).startswith(b"member 0 on n")
    assert refs[0].to_json() and JobRef.from_json(refs[0].to_json()) == refs[0]
    print(f"\ntrivial task: state first seen at {seen[refs[0].job_id]} s after submit")


def test_gang_runs_one_member_per_node_and_logs_each(backend):
    ref = backend.submit(backend.materialize(unit("gang", 2, "time.sleep(0.5)")))
    assert ref.members == 2 and ref.kind == "gang"
    out: dict = {}
    st, seen = run_until_exited(backend, [ref], output=out)
    s = st[ref.job_id]
    assert s.exit_code == 0 and len(s.hosts) == 2
    logs = [backend.logs(ref, i).decode() for i in (0, 1)]
    assert logs[0].startswith("member 0 on ") and logs[1].startswith("member 1 on ")
    nodes = [line.split()[3] for line in logs]
    assert nodes[0] != nodes[1] and set(nodes) == set(s.hosts)
    assert all("main 127.0.0.1" in line for line in logs)  # NodeAddr of the first node
    assert bytes(out[(ref.job_id, 1, "stdout")]).decode() == logs[1]  # wait() streamed it
    print(f"\n2-node gang: state first seen at {seen[ref.job_id]} s after submit")


def test_gang_fails_fast(backend):
    ref = backend.submit(backend.materialize(unit("gang", 2, "time.sleep(60 if m == 0 else 1.5); sys.exit(m)")))
    started: dict = {}
    st, seen = run_until_exited(backend, [ref], on_running=lambda j: started.setdefault(j, time.monotonic()))
    assert st[ref.job_id].exit_code != 0
    assert seen[ref.job_id]["exited"] - seen[ref.job_id]["running"] < 8, seen  # not the 60 s of member 0
    assert b"task 1: Exited with exit code 1" in backend.logs(ref, 0, "stderr")


def test_cancel_a_running_and_a_pending_job(backend):
    running = backend.submit(backend.materialize(unit("task", 1, "time.sleep(60)")))
    pending_backend = SlurmBackend(dataclasses.replace(backend.options, sbatch_args=["--begin=now+600"]),
                                   client=backend.client)
    pending = pending_backend.submit(pending_backend.materialize(unit("task", 1, "pass")))
    t0, live = time.monotonic(), bytearray()
    while b"member 0" not in live:  # live output: the member's first line arrives while it runs
        assert time.monotonic() - t0 < 30, backend.poll([running])
        backend.poll([running])
        backend.wait(0.2, lambda ref, m, s, data: live.extend(data))
    assert pending_backend.poll([pending])[pending.job_id].state == "queued"
    backend.cancel(running, grace=1)
    pending_backend.cancel(pending, grace=1)
    t1 = time.monotonic()
    st, _ = run_until_exited(backend, [running], timeout=30)
    assert time.monotonic() - t1 < 10
    assert st[running.job_id].reason == "cancelled (scancel)" and st[running.job_id].exit_code != 0
    # a pending job must not be signalled: Slurm 22.05 would record it as COMPLETED with exit code 0
    st, _ = run_until_exited(pending_backend, [pending], timeout=15)
    assert st[pending.job_id].reason == "cancelled (scancel)" and st[pending.job_id].exit_code != 0
    pending_backend.close()


def test_cancel_forces_a_member_that_ignores_sigterm(backend):
    ref = backend.submit(backend.materialize(unit("task", 1, "import signal; signal.signal(signal.SIGTERM, "
                                                  "signal.SIG_IGN); print('ready', flush=True); time.sleep(60)")))
    t0, live = time.monotonic(), bytearray()
    while b"ready" not in live:
        assert time.monotonic() - t0 < 30
        backend.poll([ref])
        backend.wait(0.2, lambda r, m, s, data: live.extend(data))
    t0 = time.monotonic()
    backend.cancel(ref, grace=1)  # TERM (ignored), then scancel after 1 s, then KILL after KillWait (5 s)
    st, _ = run_until_exited(backend, [ref], timeout=30)
    assert st[ref.job_id].reason == "cancelled (scancel)" and 1 < time.monotonic() - t0 < 15


def test_scancel_from_outside_is_reported(backend, slurm_cluster):
    ref = backend.submit(backend.materialize(unit("task", 1, "time.sleep(60)")))
    run_until_exited(backend, [ref], on_running=lambda j: slurm_cluster.run("scancel", j))
    st = backend.poll([ref])[ref.job_id]
    assert st.reason == "cancelled (scancel)" and st.exit_code != 0  # 143: srun TERMinated


def test_array_of_five_reports_each_element(backend):
    ref = backend.submit(backend.materialize(unit("array", 5, "sys.exit(m)")))
    st, _ = run_until_exited(backend, [ref])
    s = st[ref.job_id]
    assert ref.members == 5 and sorted(s.members) == [0, 1, 2, 3, 4]
    assert [s.member(i).exit_code for i in range(5)] == [0, 1, 2, 3, 4] and s.exit_code == 1
    assert [backend.logs(ref, i).split()[:2] for i in range(5)] == [[b"member", str(i).encode()] for i in range(5)]


def test_one_poll_call_for_many_jobs(backend):
    refs = [backend.submit(backend.materialize(unit("task", 1, "time.sleep(1)"))) for _ in range(6)]
    refs.append(backend.submit(backend.materialize(unit("array", 3, "pass"))))
    backend.poll(refs)  # the first poll learns whether sacct works here
    before = len(backend.runner.calls)
    statuses = backend.poll(refs)
    assert len(backend.runner.calls) - before == 1 and set(statuses) == {r.job_id for r in refs}
    run_until_exited(backend, refs)
    polls = [c for c in backend.runner.calls[before:] if c[0] in ("sacct", "scontrol", "squeue")]
    assert all(c[:2] == ["scontrol", "-o"] for c in polls)  # no accounting here, so never sacct again


def test_check_refuses_what_cannot_work(backend, tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_SHARED_PATHS", str(tmp_path))
    good = unit("gang", 3, "pass", store_url=str(tmp_path / "store"))
    backend.check(good)
    cases = [
        (unit("task", 1, "pass", options={"partition": "nope"}), r"partition='nope'.*debug \(3 nodes x 2 CPUs"),
        (unit("task", 1, "pass", options={"cpus_per_task": 64}), "64 CPUs per node.*largest node.*has 2"),
        (unit("task", 1, "pass", options={"mem": "100G"}), "102400 MB of memory.*has 4000"),
        (unit("task", 1, "pass", resources={"gpu": 1}), "1 GPUs per node.*has 0"),
        (unit("gang", 4, "pass"), "gang of 4 nodes.*has 3: lower num_parallel"),
        (unit("gang", 2, "pass", options={"nodes": 3}), r"@slurm\(nodes=3\).*2 node"),
    ]
    calls = len(backend.runner.calls)
    for u, match in cases:
        u.store_url = "s3://bucket/x"
        with pytest.raises(ConfigError, match=match):
            backend.check(u)
    assert len(backend.runner.calls) == calls  # sinfo once per backend


def test_check_refuses_a_store_or_log_folder_the_nodes_cannot_see(backend, tmp_path, monkeypatch):
    monkeypatch.delenv("STOKER_SHARED_PATHS", raising=False)
    local = unit("task", 1, "pass", store_url=str(tmp_path / "store"))
    with pytest.raises(ConfigError, match="(?s)store .* local filesystem.*STOKER_HOME.*STOKER_SHARED_PATHS.*s3://"):
        backend.check(local)
    with pytest.raises(ConfigError, match="log folder .* must be visible"):
        backend.check(unit("task", 1, "pass", store_url="s3://bucket/x"))
    monkeypatch.setenv("STOKER_SHARED_PATHS", f"/nonexistent:{Path(backend.options.log_dir).parent}")
    backend.check(local)
