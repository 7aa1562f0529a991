"""SlurmBackend without a cluster: check() against a recorded-style sinfo, cancel()'s order of scancels, logs()."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from stoker.backends.slurm import SlurmBackend, SlurmClient, SlurmOptions
from stoker.backends.slurm.backend import shared_reason
from stoker.errors import BackendError, ConfigError
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


# -- a gang with spares (@torchrun(spares=k)): one --no-kill job of N + k members -----------------------------------
def _job_line(job: str, state: str, nodes: str) -> str:
    return (f"JobId={job} JobName=x JobState={state} Reason=None ExitCode=0:0 StartTime=2026-12-06T14:37:03 "
            f"NodeList={nodes} BatchHost=n1 NumNodes=3\n")


def test_a_gang_with_spares_is_checked_and_submitted_as_n_plus_k_members(backend):
    backend.check(make("gang", 2, spares=1))  # 3 nodes in partition debug: fits
    with pytest.raises(ConfigError, match=r"1 spare\(s\).*needs 4 nodes but partition 'debug' has 3"):
        backend.check(make("gang", 3, spares=1))
    backend.runner.answers["sbatch"] = (0, "17\n", "")
    ref = backend.submit(backend.materialize(make("gang", 2, spares=1, first_slots=[1, 2])))
    assert ref.members == 3 and ref.task_ids == ["0", "1"] and ref.extra["spares"] == 1
    assert backend.submit(backend.materialize(make("gang", 2))).members == 2  # no spares: as before
    assert SlurmBackend.main_node_spare  # member 0 (the batch host) is the last spare


def test_a_node_slurm_removes_from_a_gang_with_spares_is_that_members_loss(backend):
    backend.runner.answers["sacct -n"] = (1, "", "Slurm accounting storage is disabled")
    ref = JobRef(backend="slurm", job_id="5", members=3, kind="gang", extra={"spares": 1})
    backend.runner.answers["scontrol"] = (0, _job_line("5", "RUNNING", "n[1-3]"), "")
    st = backend.poll([ref])["5"]
    assert st.state == "running" and not st.members and ref.extra["hosts"] == ["n1", "n2", "n3"]
    backend.runner.answers["scontrol"] = (0, _job_line("5", "RUNNING", "n[1,3]"), "")  # n2 DOWN: excised
    st = backend.poll([ref])["5"]
    assert st.state == "running" and st.member(0).state == "running" and st.member(2).state == "running"
    lost = st.member(1)
    assert lost.state == "exited" and lost.exit_code < 0 and "NODE_FAIL" in lost.reason and lost.hosts == ["n2"]
    assert ref.extra["hosts"] == ["n1", "n2", "n3"] and ref.extra["lost_hosts"] == ["n2"]  # node i stays host i
    backend.runner.answers["scontrol"] = (0, _job_line("5", "COMPLETED", "n[1,3]"), "")
    st = backend.poll([ref])["5"]
    assert st.state == "exited" and st.exit_code == 0 and st.member(1).exit_code == 0  # the job's word at the end


def test_a_gang_that_lost_its_batch_host_is_ended_once_its_step_is_over(backend):
    backend.runner.answers["sacct -n"] = (1, "", "Slurm accounting storage is disabled")
    ref = JobRef(backend="slurm", job_id="6", members=3, kind="gang", extra={"spares": 1, "hosts": ["n1", "n2", "n3"]})
    backend.runner.answers["scontrol"] = (0, _job_line("6", "RUNNING", "n[2-3]"), "")
    backend.runner.answers["squeue"] = (0, "6.0\n6.extern\n", "")
    st = backend.poll([ref])["6"]
    assert st.state == "running" and st.member(0).state == "exited" and ["scancel", "6"] not in backend.runner.calls
    backend.runner.answers["squeue"] = (0, "6.extern\n", "")  # the members have ended; nothing ends the job
    st = backend.poll([ref])["6"]
    assert ["scancel", "6"] in backend.runner.calls
    assert st.state == "exited" and st.member(1).state == "exited" and st.member(1).exit_code == 0
    assert st.member(0).exit_code < 0 and "batch host n1" in st.reason
    assert backend.poll([ref])["6"] is st  # the same answer from then on


def test_slurm_identity_takes_its_own_address_from_the_node_map():
    from stoker.backends.slurm.node import node_addrs, slurm_identity

    env = {"SLURM_JOB_ID": "12", "SLURM_NODEID": "2", "SLURM_JOB_NUM_NODES": "3", "SLURM_JOB_NODELIST": "n[1-3]",
           "SLURMD_NODENAME": "n3", "STOKER_NODE_ADDRS": "n1=10.0.0.1,n2=10.0.0.2,n3=10.0.0.3"}
    ident = slurm_identity(env)
    assert (ident.member, ident.num_nodes, ident.main_addr, ident.host, ident.addr) == (2, 3, "n1", "n3", "10.0.0.3")
    assert slurm_identity({**env, "STOKER_NODE_ADDRS": ""}).addr == ""  # no map: own_addr() falls back
    assert node_addrs("a=1,bad,,b=2,=3") == {"a": "1", "b": "2"}


def test_a_member_that_ended_is_reported_by_the_exit_code_it_left(backend, tmp_path):
    """A gang with spares: the job goes on while its spare waits, so each member's end comes from its exit file."""
    from stoker.backends.slurm.render import member_exit

    backend.runner.answers["sacct -n"] = (1, "", "Slurm accounting storage is disabled")
    folder = tmp_path / "logs" / "g"
    folder.mkdir(parents=True)
    ref = JobRef(backend="slurm", job_id="7", members=3, kind="gang", extra={"spares": 1, "log_dir": str(folder)})
    backend.runner.answers["scontrol"] = (0, _job_line("7", "RUNNING", "n[1-3]"), "")
    Path(member_exit(str(folder), "7", 1)).write_text("0\n")
    Path(member_exit(str(folder), "7", 2)).write_text("-9\n")
    st = backend.poll([ref])["7"]
    assert st.state == "running" and st.member(0).state == "running"
    assert (st.member(1).state, st.member(1).exit_code, st.member(1).hosts) == ("exited", 0, ["n2"])
    assert (st.member(2).state, st.member(2).exit_code) == ("exited", -9)


def test_a_gang_that_ended_reports_each_members_own_exit_code(backend, tmp_path):
    """srun's code, the job's, is one for every node: when node 1 dies, --kill-on-bad-exit TERMinates node 0, and only
    the exit files tell the node that died (the one whose host is blamed) from the one srun stopped."""
    from stoker.backends.slurm.render import member_exit

    backend.runner.answers["sacct -n"] = (1, "", "Slurm accounting storage is disabled")
    folder = tmp_path / "logs" / "g"
    folder.mkdir(parents=True)
    ref = JobRef(backend="slurm", job_id="8", members=3, kind="gang", extra={"log_dir": str(folder)})
    backend.runner.answers["scontrol"] = (0, _job_line("8", "FAILED", "n[1-3]").replace("0:0", "143:0"), "")
    Path(member_exit(str(folder), "8", 0)).write_text("-15\n")
    Path(member_exit(str(folder), "8", 1)).write_text("-9\n")
    st = backend.poll([ref])["8"]
    assert st.state == "exited" and st.exit_code == 143
    assert (st.member(0).exit_code, st.member(1).exit_code, st.member(1).hosts) == (-15, -9, ["n2"])
    assert st.member(2).exit_code == 143  # it left no file (lost with its node): the job's code stands


def test_the_supervisor_leaves_the_agents_exit_code(tmp_path):
    from stoker.backends.slurm.node import supervised

    def agent(code):
        def run():
            os._exit(code)
        return run

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        assert supervised(agent(3), str(tmp_path / "a.exit")) == 3 and (tmp_path / "a.exit").read_text() == "3\n"
        assert supervised(lambda: os.kill(os.getpid(), signal.SIGKILL), str(tmp_path / "b.exit")) == 137
        assert (tmp_path / "b.exit").read_text() == "-9\n"
        assert supervised(lambda: None, str(tmp_path / "c.exit")) == 0
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN  # Slurm's TERM is for the agent alone
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_a_gang_with_spares_still_running_when_the_run_ends_is_cancelled(backend):
    backend.runner.answers["sacct -n"] = (1, "", "Slurm accounting storage is disabled")
    backend.spares_sweep_s = 0.0
    ref = JobRef(backend="slurm", job_id="8", members=3, kind="gang", extra={"spares": 1})
    backend.runner.answers["scontrol"] = (0, _job_line("8", "RUNNING", "n[1-3]"), "")
    backend.poll([ref])
    backend.close()  # its spare never left (its host died): cancelled after the wait
    assert ["scancel", "8"] in backend.runner.calls
    backend.runner.calls.clear()
    backend.runner.answers["scontrol"] = (0, _job_line("9", "RUNNING", "n[1-3]"), "")
    ref9 = JobRef(backend="slurm", job_id="9", members=3, kind="gang", extra={"spares": 1})
    backend.poll([ref9])
    backend.runner.answers["scontrol"] = (0, _job_line("9", "COMPLETED", "n[1-3]"), "")
    backend.close()  # the spare left when the gang was over: nothing to cancel
    assert not [c for c in backend.runner.calls if c[0] == "scancel"]


def test_signalling_a_job_that_stopped_running_meanwhile_is_not_an_error():
    """`scancel --signal=TERM --state=RUNNING J` on a job that left RUNNING (its run cancelled it a moment before
    `stoker kill` got to it) exits 1 and says nothing: the job is over, not a failure to cancel it."""
    silent = SlurmClient(runner=Runner({"scancel --signal": (1, "", "")}), env={})
    assert silent.scancel("8", signal="TERM") is False
    refused = SlurmClient(runner=Runner({"scancel --signal": (1, "", "scancel: error: Access/permission denied")}),
                          env={})
    with pytest.raises(BackendError, match="permission denied"):
        refused.scancel("8", signal="TERM")
