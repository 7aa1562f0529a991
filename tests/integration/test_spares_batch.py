"""Hot spares on AWS Batch, emulated (tests/batch_emulator.py; issue 26): a gang of 2 nodes with 1 spare is ONE
multi-node job of 3 nodes whose main node (node 0) waits as the spare, because Batch ends the job when its main node
exits and does nothing when a child node dies (backends/aws/node.py). A child node's container is killed mid-training
-> the main node takes its slot in the same job, training resumes from the last committed checkpoint, and the final
weights are bitwise those of an uninterrupted run. First, the emulator's own model of those two Batch behaviours."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from tests.spares_support import STEPS, FlowRun, committed, final_weights, reference_weights, spares_run

SLEEPER = ("import os, subprocess, sys, time\n"
           "kid = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"
           "open('grandchild.pid', 'w').write(str(kid.pid))\n"
           "time.sleep(600)\n")


@pytest.fixture
def emulator_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("BATCH_EMULATOR_DIR", str(tmp_path / "emulator"))
    return tmp_path / "emulator"


def _describe(emu, ids: list[str]) -> dict[str, dict]:
    return {d["jobId"]: d for d in emu.describe_jobs(jobs=ids)["jobs"]}


def _until(check, timeout: float = 30, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.1)


@pytest.mark.aws
@pytest.mark.slow
def test_the_emulator_loses_a_child_as_batch_does_and_ends_the_job_with_its_main_node(aws, emulator_dir):
    """A killed child (its whole process tree, a grandchild in a session of its own too) is FAILED with a lost
    host's reason and no exit code, and nothing else changes; the main node's exit ends the job and stops the rest."""
    import psutil

    from tests.batch_emulator import EmulatedBatch, job_states, kill_node, make_queue

    queue = make_queue("stoker-test")
    emu = EmulatedBatch(aws.client("batch"), aws.client("logs"), workdir=str(emulator_dir / "work"))
    container = {"image": "stoker:test", "command": ["python", "-c", SLEEPER],
                 "resourceRequirements": [{"type": "VCPU", "value": "1"}, {"type": "MEMORY", "value": "512"}]}
    arn = emu.register_job_definition(jobDefinitionName="sleepers", type="multinode", platformCapabilities=["EC2"],
                                      nodeProperties={"numNodes": 3, "mainNode": 0, "nodeRangeProperties": [
                                          {"targetNodes": "0:", "container": container}]})["jobDefinitionArn"]
    job = emu.submit_job(jobName="sleepers", jobQueue=queue, jobDefinition=arn)["jobId"]
    ids = [job] + [f"{job}#{i}" for i in range(3)]
    try:
        grandchild = emulator_dir / "work" / job / "node2" / "grandchild.pid"
        _until(grandchild.exists, what="node 2 started its grandchild")
        (state,) = [s for s in job_states() if s["id"] == job]
        assert [n["index"] for n in state["nodes"]] == [0, 1, 2]
        kid = int(grandchild.read_text())
        killed = kill_node(job, 2, how="instance")
        assert state["nodes"][2]["pid"] in killed and kid in killed
        _until(lambda: _describe(emu, ids)[f"{job}#2"]["status"] == "FAILED", what="node 2 FAILED")
        assert not psutil.pid_exists(kid) or psutil.Process(kid).status() == psutil.STATUS_ZOMBIE
        time.sleep(1.0)  # Batch takes no action on the other nodes: they and the job run on
        d = _describe(emu, ids)
        assert d[f"{job}#2"]["statusReason"].startswith("Host EC2 (instance i-") and \
            "exitCode" not in d[f"{job}#2"]["container"]
        assert [d[i]["status"] for i in (job, f"{job}#0", f"{job}#1")] == ["RUNNING"] * 3
        with pytest.raises(RuntimeError, match="not running"):
            kill_node(job, 2)
        kill_node(job, 0, how="container")  # the main node's container dies: the job is over
        _until(lambda: _describe(emu, ids)[job]["status"] == "FAILED", what="the job FAILED")
        _until(lambda: _describe(emu, ids)[f"{job}#1"]["status"] != "RUNNING", what="node 1 stopped")
        d = _describe(emu, ids)
        assert d[job]["container"] == {} and d[f"{job}#0"]["container"]["exitCode"] == 137
        assert d[f"{job}#0"]["statusReason"] == "Essential container in task exited"
        assert d[f"{job}#1"]["statusReason"] == "the main node exited"
    finally:
        for pid in emu.pids():
            try:
                os.killpg(pid, 9)
            except ProcessLookupError:
                pass


# -- the end-to-end run ---------------------------------------------------------------------------------------------

def Run(cwd: Path, data: Path, ckpt: Path, env: dict[str, str]) -> FlowRun:  # noqa: N802 - reads as the run
    """`spares_flow.py run --backend batch=train` in the background (its whole output left in run.log)."""
    return spares_run(cwd, data, ckpt, "--backend", "batch=train", steps=STEPS, env=env, log=cwd / "run.log")


@pytest.fixture
def batch_env(aws, tmp_path, monkeypatch):
    from tests.batch_emulator import emulated_batch_env

    env = emulated_batch_env(aws, tmp_path)
    env["STOKER_PREFLIGHT"] = "0"
    monkeypatch.setenv("BATCH_EMULATOR_DIR", env["BATCH_EMULATOR_DIR"])  # job_states / kill_node from this process
    return env


@pytest.mark.aws
@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize(("slot", "how"), [(0, "instance"), (1, "container")],
                         ids=["rendezvous-host-instance-lost", "other-node-container-killed"])
def test_a_killed_child_is_replaced_by_the_main_node_in_the_same_batch_job(batch_env, tmp_path, monkeypatch, slot,
                                                                           how):
    import torch

    from stoker.distributed.gangboard import GangBoard
    from stoker.store.blobs import open_store
    from tests.batch_emulator import job_states, kill_node

    data, weights_ref = reference_weights(STEPS)  # the same gang, uninterrupted (on this host: the same ranks)
    ckpt = tmp_path / "ckpt"
    before = {s["id"] for s in job_states()}
    run = Run(tmp_path, data, ckpt, batch_env)
    member = int(run.wait_for(rf"spares_flow: node {slot} member (\d+) pid \d+ attempt 0").group(1))
    assert member == slot + 1, "generation 0 runs on Batch nodes 1..N: the main node is the spare"
    deadline = time.time() + 300
    while not 8 <= committed(ckpt) and time.time() < deadline:
        assert run.proc.poll() is None, run.text[-6000:]
        time.sleep(0.05)
    at = committed(ckpt)
    assert 8 <= at < STEPS, f"a checkpoint committed mid-training (step {at})"
    (job,) = [s for s in job_states() if s["n"] == 3 and s["id"] not in before]
    killed_at = time.time()
    assert kill_node(job["id"], member, how=how)
    code = run.finish()
    out = run.text
    assert code == 0, out[-8000:]
    assert f"nodes ran on members {sorted({0, 1, 2} - {member})}" in out, out[-8000:]
    if m := re.search(r"generation 1 recovered in ([\d.]+) s", out):
        first = next((t for t, ln in run.lines if "generation 1 of the gang" in ln), None)
        print(f"Batch (emulated), {how} of node {slot} lost: recovery {float(m.group(1)):.1f} s as stoker reports it"
              + (f", kill -> generation 1 started {first - killed_at:.1f} s" if first else ""))

    # one Batch job, never resubmitted: the spare took the slot inside it
    monkeypatch.setenv("STOKER_HOME", batch_env["STOKER_HOME"])
    store = open_store(batch_env["STOKER_STORE"])
    run_id = run.wait_for(r"stoker: run SparesFlow/(\S+) started").group(1)
    refs = [json.loads(store.read(n)) for n in store.list(f"runs/SparesFlow/{run_id}/jobs/") if n.endswith(".json")]
    train = [r for r in refs if r["step"] == "train"]
    assert [(r["job_id"], r["attempt"], r["members"]) for r in train] == [(job["id"], 0, 3)], train
    (state,) = [s for s in job_states() if s["id"] == job["id"]]
    nodes = {n["index"]: n for n in state["nodes"]}
    assert nodes[member]["code"] == -9 and nodes[0]["code"] == 0, "the main node ran the slot and ended the job"
    if how == "instance":
        assert nodes[member]["lost"] and nodes[member]["reason"].startswith("Host EC2 (instance")
    assert state["terminated"] is None, "nobody called TerminateJob: the job ended with its main node"

    # the generations: which member left, which spare joined
    control = train[0]["task_ids"][0]
    board = GangBoard.of(store, "SparesFlow", run_id, "train", control, 0)
    gens = board.history()
    slots = [1, 2]
    slots[slot] = 0
    assert [g.slots for g in gens] == [[1, 2], slots], [g.slots for g in gens]
    assert gens[1].lost["member"] == member and gens[1].joined == 0
    assert board.ended() == "done"

    # resumed from the last committed checkpoint: the final weights are those of the uninterrupted run, bitwise
    weights = final_weights(ckpt)
    assert weights.keys() == weights_ref.keys()
    for key in weights_ref:
        assert torch.equal(weights[key], weights_ref[key]), key
