"""The localhost Slurm cluster from tests/slurm_cluster.py runs batch jobs and 2-node gangs."""

from __future__ import annotations

import subprocess
import time

import pytest

pytestmark = pytest.mark.slurm


def _sbatch(cluster, *args: str) -> str:
    return cluster.run("sbatch", "--parsable", *args).stdout.strip().split(";")[0]


def _wait_done(cluster, job: str, timeout: float = 60) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = cluster.run("scontrol", "-o", "show", "job", job).stdout
        fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
        if fields.get("JobState") not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", None):
            return fields
        time.sleep(0.1)
    raise TimeoutError(f"job {job} not done after {timeout}s:\n{out}")


def test_cluster_has_idle_nodes(slurm_cluster):
    out = slurm_cluster.run("sinfo", "-h", "-N", "-o", "%N %t %c %m").stdout.split("\n")
    assert sorted(line.split()[0] for line in out if line) == ["n1", "n2", "n3"]


def test_batch_job_completes(slurm_cluster, tmp_path):
    job = _sbatch(slurm_cluster, "-o", f"{tmp_path}/%j.out", "--wrap", "echo hello from $SLURMD_NODENAME")
    done = _wait_done(slurm_cluster, job)
    assert (done["JobState"], done["ExitCode"]) == ("COMPLETED", "0:0")
    assert (tmp_path / f"{job}.out").read_text().startswith("hello from n")


def test_failed_job_reports_exit_code(slurm_cluster, tmp_path):
    job = _sbatch(slurm_cluster, "-o", f"{tmp_path}/%j.out", "--wrap", "exit 3")
    done = _wait_done(slurm_cluster, job)
    assert (done["JobState"], done["ExitCode"], done["Reason"]) == ("FAILED", "3:0", "NonZeroExitCode")


def test_two_node_gang_runs_one_task_per_node(slurm_cluster, tmp_path):
    script = tmp_path / "gang.sh"
    script.write_text(
        "#!/bin/bash\n"
        'first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -1)\n'
        'echo "master=$(scontrol -o show node "$first" | grep -o "NodeAddr=[^ ]*")"\n'
        f"srun --kill-on-bad-exit=1 --output={tmp_path}/node-%n.out "
        "bash -c 'echo NODEID=$SLURM_NODEID NODE=$SLURMD_NODENAME'\n"
    )
    job = _sbatch(slurm_cluster, "-N2", "-o", f"{tmp_path}/gang.out", str(script))
    done = _wait_done(slurm_cluster, job)
    assert (done["JobState"], done["NumNodes"]) == ("COMPLETED", "2"), (tmp_path / "gang.out").read_text()
    assert "master=NodeAddr=127.0.0.1" in (tmp_path / "gang.out").read_text()
    lines = sorted((tmp_path / f"node-{i}.out").read_text().strip() for i in (0, 1))
    assert [line.split()[0] for line in lines] == ["NODEID=0", "NODEID=1"]
    assert len({line.split()[1] for line in lines}) == 2  # two distinct slurmd nodes


def test_slurm_conf_is_set_for_clients(slurm_cluster):
    p = subprocess.run(["squeue", "-h"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
