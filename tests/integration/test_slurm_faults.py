"""Issue 25, "found on the real Slurm cluster", on the localhost cluster (slurmctld + 3 slurmd, tests/slurm_cluster.py):
- a lost node (its slurmd, its step daemons and its job processes killed at once, as when a host dies) is named as the
  lost node, with its host, and its gang is stopped within 10 s, not when Slurm gives the host up;
- a gang cancelled from outside (scancel) ends the run: it is not retried under @retry;
- a request sbatch refuses ends the run with "fix the error above and run again", not a `resume` that fails alike;
- a gang larger than the cluster, sized by a config value, is refused before `start` runs and nothing is submitted."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from stoker import Flow
from tests.helpers import EXAMPLES, FLOWS, run_flow
from tests.spares_support import slurm_node_of

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture
def shared(tmp_path, slurm_cluster, monkeypatch):
    """The test folder and the flows' folder stand for the cluster's shared filesystem (all nodes are this host)."""
    monkeypatch.setenv("STOKER_SHARED_PATHS", f"{tmp_path}:{FLOWS}")
    return tmp_path


def squeue() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %j %T %N"], capture_output=True, text=True, check=True).stdout
    return [ln for ln in out.splitlines() if ln.strip()]


class Lines:
    """A run's output, line by line with the time each arrived."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.lines = proc, []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def wait_for(self, text: str, timeout: float) -> float:
        deadline = time.time() + timeout
        while time.time() < deadline:
            hit = next((t for t, ln in self.lines if text in ln), None)
            if hit is not None:
                return hit
            assert self.proc.poll() is None or self.thread.is_alive(), "\n".join(ln for _, ln in self.lines)
            time.sleep(0.1)
        raise AssertionError(f"no {text!r} in {timeout} s:\n" + "\n".join(ln for _, ln in self.lines))

    @property
    def text(self) -> str:
        return "\n".join(ln for _, ln in self.lines)


def _start(flow: Path, *args: str, cwd: Path) -> tuple[subprocess.Popen, Lines]:
    proc = subprocess.Popen([sys.executable, "-u", str(flow), "run", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    return proc, Lines(proc)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])  # a host that dies / that hangs (its sockets stay open)
def test_a_lost_node_is_named_and_its_gang_stopped_within_10_s(shared, slurm_cluster, how):
    proc, out = _start(FLOWS / "lost_node_flow.py", "--seconds", "120", "--backend", "slurm=train", cwd=shared)
    node = None
    try:
        out.wait_for("collective loop started on rank 1", 180)
        out.wait_for("collective loop started on rank 0", 30)
        job = re.search(r"submitted to slurm as job (\d+)", out.text).group(1)
        node = slurm_node_of(job, 1)
        lost_at = time.time()
        assert slurm_cluster.kill_node(node, getattr(signal, how)), f"nothing of node {node} to kill"
        stopped = out.wait_for("gang train stopped", 60)
        assert proc.wait(timeout=60) == 1, out.text
    finally:
        if proc.poll() is None:
            proc.kill()
        if node:
            slurm_cluster.revive_node(node)
    print(f"node {node} lost ({how}) at {lost_at:.2f}; gang stopped {stopped - lost_at:.1f} s later")
    assert stopped - lost_at < 10, out.text
    assert f"gang train: node 1 (host {node}) lost: no heartbeat for" in out.text, out.text
    run = Flow("LostNodeFlow").latest_run
    failed = [t for t in run["train"] if t.exception is not None and t.exception.type == "NodeLost"]
    assert len(failed) == 1 and f"node 1 (host {node}) lost" in failed[0].exception.message
    assert "node 0 (task" not in out.text, "the survivor is not blamed"
    t0 = time.time()
    while squeue() and time.time() - t0 < 60:  # the batch step on node 0 ends after Slurm's KillWait
        time.sleep(0.5)
    print(f"the cancelled job left the queue {time.time() - t0:.1f} s after the node was back")
    assert not squeue()


def test_a_gang_cancelled_from_outside_ends_the_run_and_is_not_retried(shared):
    proc, out = _start(FLOWS / "sleepy_gang_flow.py", "--backend", "slurm=nap", cwd=shared)
    try:
        out.wait_for("napping on node 1", 120)
        job = re.search(r"submitted to slurm as job (\d+)", out.text).group(1)
        subprocess.run(["scancel", job], check=True)
        assert proc.wait(timeout=90) == 1, out.text
    finally:
        if proc.poll() is None:
            proc.kill()
    out.thread.join(timeout=5)
    assert out.text.count("submitted to slurm as job") == 1, "the gang once: no retry\n" + out.text
    assert "not retried" in out.text and "cancel" in out.text and " resume " in out.text, out.text
    assert Flow("SleepyGangFlow").latest_run.status == "failed"
    assert not squeue()


def test_a_refused_submission_says_fix_and_run_again(shared):
    p = run_flow(EXAMPLES / "hello.py", "run", "--with", "slurm:constraint=gpu80", cwd=shared, check=False)
    out = p.stdout + p.stderr
    assert p.returncode == 1 and "Invalid feature specification" in out and "sinfo -o '%N %f'" in out, out
    last = [ln for ln in out.splitlines() if "stoker: run HelloFlow/" in ln][-1]
    assert last.endswith("fix the error above and run again") and "resume" not in last, out
    assert not squeue()


def test_a_gang_larger_than_the_cluster_is_refused_before_start(shared):
    p = run_flow("config_gang_flow.py", "run", "--set", "cluster.nodes=4", "--backend", "slurm", cwd=shared,
                 check=False)
    out = p.stdout + p.stderr
    assert p.returncode == 1 and "a gang of 4 nodes" in out and "has 3" in out, out
    assert "start ran" not in out and "submitted" not in out, out
    assert not squeue()
