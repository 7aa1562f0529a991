"""Hot spares on the real Slurm cluster (issue 26; localhost: slurmctld + 3 slurmd, tests/slurm_cluster.py): a gang of
2 nodes with 1 spare (tests/flows/spares_flow.py, one `--no-kill` job of 3 nodes) trains the tiny model; a test kills
one active node from outside mid-training (its slurmd, step daemons and job processes at once, as a host that dies)
-> the spare takes its place within the same Slurm job, training resumes from the last committed checkpoint and the
final weights are bitwise those of an uninterrupted run. Killing the node that hosted the rendezvous (node 0's
member) works alike; killing both active nodes with one spare falls back to today's whole-gang retry.

On Slurm the spare is member 0, the batch host (SlurmBackend.main_node_spare): generation 0 runs on members 1 and 2.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.helpers import FLOWS
from tests.spares_support import STEPS, FlowRun, final_weights, reference_weights, spares_run
from tests.spares_support import slurm_node_of as node_of

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.torch]


def Run(cwd: Path, data: Path, ckpt: Path, slurm: bool = True) -> FlowRun:  # noqa: N802 - reads as the run
    """`spares_flow.py run --backend slurm=train` (or locally: the reference) in the background."""
    return spares_run(cwd, data, ckpt, *(["--backend", "slurm=train"] if slurm else []), steps=STEPS)


def squeue() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %j %T %N"], capture_output=True, text=True, check=True).stdout
    return [ln for ln in out.splitlines() if ln.strip()]


@pytest.fixture(scope="module")
def reference():
    """Token data and the final weights of an uninterrupted run of the same gang (on this host: the same gloo ranks)."""
    return reference_weights(STEPS)


@pytest.fixture
def shared(tmp_path, slurm_cluster, monkeypatch):
    """The test folder and the flows' folder stand for the cluster's shared filesystem (all nodes are this host)."""
    monkeypatch.setenv("STOKER_SHARED_PATHS", f"{tmp_path}:{FLOWS}")
    monkeypatch.setenv("STOKER_PREFLIGHT", "0")
    return tmp_path


def kill_mid_training(run: FlowRun, cluster, node: int) -> tuple[float, str, int, str]:
    """Kill the Slurm node of the member running gang node `node` once a checkpoint past step 8 is committed.
    Returns (when, the Slurm node, the member, the job id)."""
    m = run.wait_for(rf"spares_flow: node {node} member (\d+) pid \d+ attempt 0")
    member = int(m.group(1))
    job = run.wait_for(r"submitted to slurm as job (\d+)").group(1)
    host = node_of(job, member)
    run.wait_for(r"checkpoint step_000000(1[2-9]|[2-9]\d) committed")
    at = time.time()
    assert cluster.kill_node(host), f"nothing of node {host} to kill"
    return at, host, member, job


def timeline(run: FlowRun, since: float) -> str:
    """The run's gang lines from `since` on, each with its offset in seconds (printed for the report)."""
    keep = ("gang train", "generation", "committed", "resum", "lost", "retry", "submitted")
    return "\n".join(f"  +{t - since:6.1f} s  {ln}" for t, ln in run.lines
                     if t >= since - 1 and any(k in ln for k in keep))


def same_weights(ckpt: Path, reference: dict) -> None:
    weights = final_weights(ckpt)
    assert weights.keys() == reference.keys()
    for key in reference:
        assert torch.equal(weights[key], reference[key]), key


@pytest.mark.timeout(900)
@pytest.mark.parametrize("node", [1, 0], ids=["a-node", "the-rendezvous-host"])
def test_a_lost_node_is_replaced_by_the_spare_in_the_same_slurm_job(shared, slurm_cluster, reference, node):
    data, weights = reference
    run = Run(shared, data, shared / "ckpt")
    host = None
    try:
        killed, host, member, job = kill_mid_training(run, slurm_cluster, node)
        assert run.finish() == 0, run.text
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
        if host:
            slurm_cluster.revive_node(host)
    out = run.text
    assert out.count("submitted to slurm as job") == 1, "one Slurm job, no resubmission:\n" + out
    assert member == node + 1, "generation 0 runs on members 1 and 2; member 0 (the batch host) is the spare"
    assert re.search(rf"node {node} \(member {member}, host {host}\) lost: .*spare member 0 takes its place in "
                     rf"generation 1, in the same job", out), out
    first_step = run.wait_at(r"generation 1 of the gang", after=killed)[0]
    recovered = float(run.wait_for(r"generation 1 recovered in ([\d.]+) s").group(1))
    print(f"Slurm job {job}: node {node} (member {member}, {host}) killed; recovery {recovered:.1f} s as stoker "
          f"reports it; kill -> generation 1 started {first_step - killed:.1f} s\n{timeline(run, killed)}")
    assert "retry 1 of" not in out, "no whole-gang retry:\n" + out
    assert f"nodes ran on members {sorted({0, 1, 2} - {member})}" in out, out
    same_weights(shared / "ckpt", weights)
    t0 = time.time()
    while squeue() and time.time() - t0 < 30:
        time.sleep(0.5)
    assert not squeue()


@pytest.mark.timeout(900)
def test_two_lost_nodes_with_one_spare_retry_the_whole_gang(shared, slurm_cluster, reference):
    data, weights = reference
    run = Run(shared, data, shared / "ckpt")
    hosts = []
    try:
        killed, host, _, job = kill_mid_training(run, slurm_cluster, 1)
        hosts.append(host)
        run.wait_for(r"spare member 0 takes its place in generation 1")
        run.wait_for(r"generation 1 of the gang: node 0", after=killed)
        time.sleep(1.0)
        other = node_of(job, 1)  # node 0's member, still on its first host
        assert slurm_cluster.kill_node(other)
        hosts.append(other)
        run.wait_for(r"no spare left: the gang fails as one")
        run.wait_for(r"retry 1 of 1")
        for h in hosts:  # the retry is a new job of 3 nodes: it starts once both hosts are back
            slurm_cluster.revive_node(h, busy_ok=True)
        hosts.clear()
        assert run.finish(timeout=420) == 0, run.text
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
            print(run.text)
        for h in hosts:
            slurm_cluster.revive_node(h)
    out = run.text
    print(f"Slurm job {job}: two nodes of a gang with one spare killed ({', '.join([host, other])})\n"
          f"{timeline(run, killed)}")
    assert out.count("submitted to slurm as job") == 2, out
    same_weights(shared / "ckpt", weights)
