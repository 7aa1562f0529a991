"""Hot spares on the local backend (issue 26): a gang of 2 nodes with 1 spare (tests/flows/spares_flow.py) trains the
tiny model; a test kills one active node's processes from outside mid-training (SIGKILL of its member process and
everything under it, as a host that dies ends them) -> the spare takes its place in the same job, training resumes
from the last committed checkpoint, and the final weights are bitwise those of an uninterrupted run. Killing the node
that hosts the rendezvous (node 0) works alike; killing both active nodes with one spare falls back to the whole-gang
retry of today. With `evict_stragglers=True`, a node the trainer names a straggler is swapped for the spare after
its next checkpoint, and the weights are still bitwise those of the uninterrupted run."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import psutil
import pytest
import torch

from tests.spares_support import STEPS, FlowRun, final_weights, kill_tree, reference_weights, spares_run

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def Run(cwd: Path, data: Path, ckpt: Path, env: dict[str, str]) -> FlowRun:  # noqa: N802 - reads as the run
    return spares_run(cwd, data, ckpt, steps=STEPS, env=env)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A folder, token data, the runs' environment and the weights of an uninterrupted run of the same gang."""
    tmp = tmp_path_factory.mktemp("spares")
    data, weights = reference_weights(STEPS)
    env = {"STOKER_HOME": str(tmp / "home"), "STOKER_STORE": "", "STOKER_PREFLIGHT": "0"}
    return tmp, data, env, weights


def kill_mid_training(run: FlowRun, node: int) -> float:
    """Kill the member running `node` once a checkpoint past step 8 is committed; returns when."""
    pid = int(run.wait_for(rf"spares_flow: node {node} member \d+ pid (\d+) attempt 0").group(1))
    run.wait_for(r"checkpoint step_000000(1[2-9]|[2-9]\d) committed")
    at = time.time()
    kill_tree(pid)
    return at


@pytest.mark.parametrize("node", [1, 0], ids=["a-node", "the-rendezvous-host"])
def test_a_lost_node_is_replaced_by_the_spare_in_the_same_job(setup, node):
    tmp, data, env, reference = setup
    ckpt = tmp / f"ckpt-{node}"
    run = Run(tmp, data, ckpt, env)
    killed = kill_mid_training(run, node)
    assert run.finish() == 0, run.text
    out = run.text
    took = run.wait_for(r"spare member 2 takes its place in generation 1").group(0)
    assert f"node {node} (member {node}, host" in out and "lost: its process was killed by signal 9" in out, out
    recovered = float(run.wait_for(r"generation 1 recovered in ([\d.]+) s").group(1))
    first_step = next(t for t, ln in run.lines if "generation 1 of the gang" in ln)
    print(f"{took}; recovery {recovered:.1f} s as stoker reports it, kill -> generation 1 started "
          f"{first_step - killed:.1f} s")
    assert recovered < 60
    assert "retry 1 of" not in out, "no whole-gang retry: " + out
    assert f"nodes ran on members {sorted({0, 1, 2} - {node})}" in out, out
    # both generations' ranks, the spare's included, were forked from warm launchers, none started anew
    assert out.count("rank(s) forked from the warm launcher") == 4, out
    assert "started as new processes" not in out and "warm launcher is started again" not in out, out
    weights = final_weights(ckpt)
    assert weights.keys() == reference.keys()
    for key in reference:
        assert torch.equal(weights[key], reference[key]), key
    # the run's record: the generations, which node left and which spare joined
    gang = max((tmp / "home" / "store" / "runs" / "SparesFlow").glob("*/train/*/0/gang"),
               key=lambda p: (p / "current.json").stat().st_mtime)  # this run's
    gens = [json.loads(p.read_text()) for p in sorted(gang.glob("gen-*.json"))]
    assert [g["slots"] for g in gens] == [[0, 1], [2, 1] if node == 0 else [0, 2]]
    assert gens[1]["lost"]["member"] == node and gens[1]["joined"] == 2
    assert json.loads((gang / "end.json").read_text())["state"] == "done"


def test_two_lost_nodes_with_one_spare_retry_the_whole_gang(setup):
    tmp, data, env, reference = setup
    ckpt = tmp / "ckpt-two"
    run = Run(tmp, data, ckpt, env)
    kill_mid_training(run, 1)
    run.wait_for(r"spare member 2 takes its place in generation 1")
    run.wait_for(r"generation 1 of the gang: node 0")
    pid = int(run.wait_for(r"spares_flow: node 0 member 0 pid (\d+) attempt 0").group(1))
    time.sleep(1.0)
    kill_tree(pid)
    assert run.finish() == 0, run.text
    out = run.text
    assert "no spare left: the gang fails as one" in out and "retry 1 of 1" in out, out
    weights = final_weights(ckpt)
    for key in reference:
        assert torch.equal(weights[key], reference[key]), key


def test_a_straggler_is_evicted_at_a_checkpoint(setup):
    """Rank 1 sleeps 0.15 s a step (stoker.train's test hook): named a straggler after 3 windows, it is swapped for
    the spare after the next checkpoint; the spare's rank 1 is slow too (the hook follows the rank), and with no
    spare left it stays."""
    tmp, data, env, reference = setup
    ckpt = tmp / "ckpt-straggler"
    run = Run(tmp, data, ckpt, {**env, "SPARES_FLOW_EVICT": "1", "STOKER_TEST_SLOW_RANK": "1:0.15"})
    assert run.finish() == 0, run.text
    out = run.text
    assert re.search(r"node 1 \(member 1, host .*\) evicted as a straggler after the checkpoint of step \d+: node 1",
                     out), out
    assert "spare member 2 takes its place in generation 1" in out, out
    assert "no spare left to take its place: it stays" in out, out
    assert "nodes ran on members [0, 2]" in out, out
    weights = final_weights(ckpt)
    for key in reference:
        assert torch.equal(weights[key], reference[key]), key


def test_a_node_whose_own_worker_is_killed_leaves_for_the_spare(setup):
    """Node 1's trainer process alone gets SIGKILL (as the kernel's out-of-memory killer does): its agent lives,
    sees its own worker killed, says so and leaves; the spare takes its place."""
    tmp, data, env, reference = setup
    ckpt = tmp / "ckpt-oom"
    run = Run(tmp, data, ckpt, env)
    pid = int(run.wait_for(r"spares_flow: node 1 member \d+ pid (\d+) attempt 0").group(1))
    run.wait_for(r"checkpoint step_000000(1[2-9]|[2-9]\d) committed")
    workers = [p for p in psutil.Process(pid).children(recursive=True)
               if p.name().startswith("stoker-rank")]
    assert len(workers) == 1, workers
    workers[0].send_signal(signal.SIGKILL)
    assert run.finish() == 0, run.text
    out = run.text
    assert "node 1 (member 1): its workers were killed by signal 9 (SIGKILL: out of memory?); it leaves" in out, out
    assert re.search(r"node 1 \(member 1, host .*\) left: its workers were killed by signal 9 .*; spare member 2 "
                     r"takes its place in generation 1", out), out
    assert "retry 1 of" not in out and "nodes ran on members [0, 2]" in out, out
    weights = final_weights(ckpt)
    for key in reference:
        assert torch.equal(weights[key], reference[key]), key
