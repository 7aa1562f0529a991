"""Flows on a real Slurm cluster (slurmctld + 3 slurmd on localhost, started by the `slurm_cluster` fixture):
every step on Slurm, a foreach as one job array, a 2-node torchrun gang, and jobs that never outlive their
run (Ctrl-C, `stoker kill`, a SIGKILLed `run`, a job cancelled from outside)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stoker import Flow
from tests.helpers import EXAMPLES, FLOWS, run_flow

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture
def shared(tmp_path, slurm_cluster, monkeypatch):
    """The test folder stands for the cluster's shared filesystem (all nodes are this host)."""
    monkeypatch.setenv("STOKER_SHARED_PATHS", str(tmp_path))
    return tmp_path


def squeue() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True, check=True).stdout
    return [ln for ln in out.splitlines() if ln.strip()]


def jobs_of(run) -> list[dict]:
    store = Path(os.environ["STOKER_HOME"]) / "store" / "runs" / run.parent.id / run.id / "jobs"
    return [json.loads(p.read_text()) for p in sorted(store.glob("*.json"))]


def wait_for(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_hello_with_every_step_on_slurm(shared):
    p = run_flow(EXAMPLES / "hello.py", "run", "--backend", "slurm", cwd=shared)
    run = Flow("HelloFlow").latest_run
    assert run.successful and run["hello"].task.data.message == "hello, world"
    assert "hello, world" in run["hello"].task.stdout, "the node uploaded its log"
    refs = jobs_of(run)
    assert [r["backend"] for r in refs] == ["slurm"] * 3, "three steps, three Slurm jobs, ids persisted"
    assert "submitted to slurm as job" in p.stdout
    assert not squeue()


def test_foreach_on_slurm_is_one_job_array(shared):
    run_flow(EXAMPLES / "foreach.py", "run", "--n", "6", "--with", "slurm:partition=debug", cwd=shared)
    run = Flow("ForeachFlow").latest_run
    assert run.successful
    assert sorted(t.data.value for t in run["square"]) == [i * i for i in range(1, 7)]
    arrays = [r for r in jobs_of(run) if r["step"] == "square"]
    assert len(arrays) == 1 and arrays[0]["kind"] == "array" and arrays[0]["members"] == 6


def test_allreduce_as_a_two_node_gang(shared):
    p = run_flow(EXAMPLES / "allreduce.py", "run", "--nodes", "2", "--nproc", "1", "--sizes", "4K",
                 "--iters", "2", "--backend", "slurm=allreduce", cwd=shared, timeout=300)
    assert "all_reduce OK on 2 ranks" in p.stdout
    run = Flow("AllReduceFlow").latest_run
    gang = [r for r in jobs_of(run) if r["step"] == "allreduce"]
    assert len(gang) == 1 and gang[0]["kind"] == "gang" and gang[0]["members"] == 2
    nodes = sorted(run["allreduce"], key=lambda t: t.data.node)
    assert [t.data.node for t in nodes] == [0, 1]
    assert all("result OK" in t.stdout or "world size" in t.stdout for t in nodes), "each node's log is kept"


def _start(flow: Path, *args: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(flow), "run", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _wait_running(proc: subprocess.Popen) -> None:
    deadline = time.time() + 60
    line = ""
    while "napping" not in line and time.time() < deadline:
        line = proc.stdout.readline()
        assert line or proc.poll() is None, "the run ended early"
    assert "napping" in line


def test_ctrl_c_cancels_the_slurm_jobs(shared):
    proc = _start(FLOWS / "sleepy_flow.py", "--backend", "slurm", cwd=shared)
    _wait_running(proc)
    assert squeue()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    wait_for(lambda: not squeue(), 30, "the jobs to leave the queue")
    assert Flow("SleepyFlow").latest_run.status == "killed"


def test_stoker_kill_cancels_every_live_job(shared):
    proc = _start(FLOWS / "sleepy_flow.py", "--backend", "slurm", cwd=shared)
    _wait_running(proc)
    run = Flow("SleepyFlow").latest_run
    out = subprocess.run([sys.executable, "-m", "stoker.cli.main", "kill", f"SleepyFlow/{run.id}"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "cancelled slurm job" in out.stdout
    proc.wait(timeout=60)
    wait_for(lambda: not squeue(), 30, "the jobs to leave the queue")


def test_a_killed_run_process_leaves_no_job_running(shared):
    proc = _start(FLOWS / "sleepy_flow.py", "--backend", "slurm", cwd=shared)
    _wait_running(proc)
    assert squeue()
    proc.kill()  # SIGKILL: the run cannot clean up; its guardian must
    proc.wait(timeout=10)
    wait_for(lambda: not squeue(), 30, "the guardian to cancel the orphaned jobs")


def test_a_job_cancelled_from_outside_gives_a_clear_reason(shared):
    proc = _start(FLOWS / "sleepy_flow.py", "--backend", "slurm", cwd=shared)
    _wait_running(proc)
    job = squeue()[0].split()[0]
    subprocess.run(["scancel", job], check=True)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    run = Flow("SleepyFlow").latest_run
    exc = run["nap"].task.exception
    assert exc is not None and "cancel" in exc.message, exc
    shown = subprocess.run([sys.executable, "-m", "stoker.cli.main", "show", f"SleepyFlow/{run.id}"],
                           capture_output=True, text=True).stdout
    assert "cancel" in shown


def test_refused_before_submission_with_the_fix(tmp_path, slurm_cluster, monkeypatch):
    monkeypatch.delenv("STOKER_SHARED_PATHS", raising=False)
    p = run_flow(EXAMPLES / "hello.py", "run", "--backend", "slurm", cwd=tmp_path, check=False)
    assert p.returncode == 1 and "STOKER_SHARED_PATHS" in p.stderr + p.stdout
    monkeypatch.setenv("STOKER_SHARED_PATHS", str(tmp_path))
    p = run_flow(EXAMPLES / "allreduce.py", "run", "--nodes", "5", "--backend", "slurm=allreduce", cwd=tmp_path,
                 check=False)
    assert p.returncode == 1 and "5" in p.stderr + p.stdout and "node" in (p.stderr + p.stdout).lower()
    assert not squeue(), "nothing was submitted"


def test_dry_run_prints_the_sbatch_scripts_and_submits_nothing(shared):
    p = run_flow(EXAMPLES / "allreduce.py", "run", "--backend", "slurm=allreduce", "--dry-run", cwd=shared)
    assert "#SBATCH --nodes=2" in p.stdout and "srun" in p.stdout and "stoker.backends.slurm.node" in p.stdout
    assert not squeue()


def test_dry_run_refuses_what_the_run_would(tmp_path, slurm_cluster, monkeypatch):
    """The checks the run makes before submitting run at --dry-run too: a store the nodes cannot see is refused."""
    monkeypatch.delenv("STOKER_SHARED_PATHS", raising=False)
    p = run_flow(EXAMPLES / "allreduce.py", "run", "--backend", "slurm=allreduce", "--dry-run", cwd=tmp_path,
                 check=False)
    assert p.returncode == 1 and "must be visible from the Slurm nodes" in p.stderr and "#SBATCH" not in p.stdout
    assert not squeue()


def test_resume_on_slurm_clones_what_succeeded(shared):
    """A failed array element; `resume` reruns only it on Slurm (RESUME_OK reaches the job by name)."""
    p = run_flow("resume_flow.py", "run", "--backend", "slurm", cwd=shared, check=False)
    assert p.returncode == 1 and "work item 1 breaks" in p.stdout + p.stderr
    first = Flow("ResumeFlow").latest_run
    run_flow("resume_flow.py", "resume", first.id, "--backend", "slurm", cwd=shared, env={"RESUME_OK": "1"})
    second = Flow("ResumeFlow").latest_run
    assert second.successful and second.origin_run_id == first.id
    d = second["end"].task.data
    assert d.outs == [0, 10, 20] and d.work_runs == [first.id, second.id, first.id]
    reran = [r for r in jobs_of(second) if r["step"] == "work"]
    assert len(reran) == 1 and reran[0]["members"] == 1, "only the failed element was submitted again"
    assert not squeue()


def test_the_guardian_gives_a_stopped_job_its_grace(shared, monkeypatch):
    """The run process dies (SIGKILL); its guardian cancels the job gently and waits $STOKER_KILL_GRACE before the
    hard cancel (issue 25: it came 17 ms after the gentle one). The step needs 8 s after SIGTERM, more than the
    test cluster's KillWait (5 s), so only a waited grace lets it finish."""
    marker = shared / "saved"
    monkeypatch.setenv("GRACE_MARKER", str(marker))
    monkeypatch.setenv("STOKER_KILL_GRACE", "30")
    proc = _start(FLOWS / "graceful_flow.py", "--backend", "slurm", cwd=shared)
    _wait_running(proc)
    proc.kill()
    proc.wait(timeout=10)
    wait_for(lambda: not squeue(), 60, "the job to end")
    assert marker.exists() and marker.read_text() == "saved"
