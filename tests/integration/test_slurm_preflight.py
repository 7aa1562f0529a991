"""The gang preflight on a real Slurm cluster (slurmctld + 3 slurmd on localhost): each node of an sbatch gang
checks itself before its torchrun command; a failing node stops the job, named, with no retry."""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from tests.helpers import run_flow

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.torch]


@pytest.fixture
def shared(tmp_path, slurm_cluster, monkeypatch):
    """The test folder stands for the cluster's shared filesystem (all nodes are this host)."""
    monkeypatch.setenv("STOKER_SHARED_PATHS", str(tmp_path))
    return tmp_path


def squeue() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True, check=True).stdout
    return [ln for ln in out.splitlines() if ln.strip()]


def test_a_slurm_node_missing_its_staged_data_stops_the_gang(shared):
    t0 = time.time()
    p = run_flow("preflight_flow.py", "run", "--unstaged_node", "1", "--nproc", "1", "--backend", "slurm=train",
                 cwd=shared, timeout=300, check=False)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-3000:]
    assert "submitted to slurm as job" in out
    assert "preflight failed on node 1 (" in out and "check staged data" in out, out[-3000:]
    assert "failed after 1 attempt(s): PreflightError" in out and "retry 1 of 2" not in out
    assert time.time() - t0 < 120
    assert not squeue(), "the gang's job is gone"


def test_a_slurm_gang_all_reduce_below_the_floor_and_no_preflight(shared):
    p = run_flow("preflight_flow.py", "run", "--nproc", "1", "--backend", "slurm=train", cwd=shared, timeout=300,
                 env={"STOKER_PREFLIGHT_MIN_BUSBW_GBPS": "1e9"}, check=False)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-3000:]
    assert re.search(r"preflight failed on node \d \(.*\), check all_reduce: all_reduce bus bandwidth [0-9.]+ GB/s "
                     r"\(gloo, 2 ranks\) is below the required 1e\+09 GB/s", out), out[-3000:]
    assert "retry 1 of 2" not in out
    p = run_flow("preflight_flow.py", "run", "--nproc", "1", "--backend", "slurm=train", "--no-preflight",
                 cwd=shared, timeout=300, env={"STOKER_PREFLIGHT_MIN_BUSBW_GBPS": "1e9"})
    assert "attempts [0]" in p.stdout and "preflight:" not in p.stdout, "STOKER_PREFLIGHT=0 reached the nodes"
    p = run_flow("preflight_flow.py", "run", "--nproc", "1", "--backend", "slurm=train", cwd=shared, timeout=300)
    assert "attempts [0]" in p.stdout
    assert len(re.findall(r"preflight: node \d \(.*\) ok in [0-9.]+ s", p.stdout)) == 2, p.stdout[-3000:]
