"""Straggler detection in a real gang: torchrun, 2 ranks, gloo, the tiny model (one launch runs every job).

- rank 1 slowed by the test hook (STOKER_TEST_SLOW_RANK=1:0.2) is named within a few windows, in the log, in the
  metrics records and with its figures, and rank 0 never is;
- the same with one rank per node (LOCAL_WORLD_SIZE=1): node 1 is named, its rank not again;
- a gang whose ranks are equal names nobody. Both ranks sleep the same 50 ms per step there: the tiny model's own
  step (about 5 ms) on a shared 2-core machine varies between ranks by more than the 0.7 threshold, while a real
  step, dominated by its compute, does not; the padding gives the test such a step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.unit.train.test_parallel import token_file

pytestmark = pytest.mark.slow

WORKER = textwrap.dedent("""
    import json, os, sys
    import torch, torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    from stoker.train.trainer import run_training
    for job in json.load(open(sys.argv[1])):
        env = job.pop("env")
        before = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        run_training(job)
        for k, v in before.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v
    dist.barrier()
    dist.destroy_process_group()
""")


def _job(tmp: Path, data: Path, name: str, env: dict[str, str], steps: int = 12, window: int = 2) -> dict:
    return {"out_dir": str(tmp / name), "data": {"url": str(data), "block_size": 33},
            "train": {"steps": steps, "micro_batch_size": 4, "lr": 3e-3, "log_every": window, "seed": 5},
            "checkpoint": {"save_final": False, "resume": "never"},
            "metrics": {"progress": False, "tensorboard": False}, "env": env}


@pytest.fixture(scope="module")
def gang(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stragglers")
    data = token_file(tmp / "tokens.bin")
    jobs = [_job(tmp, data, "slowed", {"STOKER_TEST_SLOW_RANK": "1:0.2"}),
            _job(tmp, data, "nodes", {"STOKER_TEST_SLOW_RANK": "1:0.2", "LOCAL_WORLD_SIZE": "1"}),
            _job(tmp, data, "equal", {"STOKER_TEST_SLOW_RANK": "0:0.05,1:0.05"}, steps=16, window=4)]
    (tmp / "worker.py").write_text(WORKER)
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
           str(tmp / "worker.py"), str(tmp / "jobs.json")]
    proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    records = {j["out_dir"].rsplit("/", 1)[-1]: [json.loads(line) for line in
                                                 (Path(j["out_dir"]) / "metrics.jsonl").read_text().splitlines()]
               for j in jobs}
    return records, proc.stdout + proc.stderr


def test_a_slowed_rank_is_named_within_a_few_windows(gang):
    records, log = gang
    slowed = records["slowed"]
    named = [r for r in slowed if r.get("stragglers")]
    assert named and named[0]["step"] <= 10, [(r["step"], r.get("straggler_score")) for r in slowed]  # <= 4 windows
    for r in named:
        assert [(s["kind"], s["rank"]) for s in r["stragglers"]] == [("rank", 1)]
    first = named[0]["stragglers"][0]
    assert first["windows"] == 3 and first["score"] < 0.3 and first["compute_s"] > 0.2 > first["median_compute_s"]
    assert first["message"].startswith("straggler: rank 1 (node 0, host ") and "s/step vs" in first["message"]
    assert first["message"] in log  # rank 0's warning
    scored = [r for r in slowed if "straggler_score" in r]
    assert all(r["slowest_rank"] == 1 for r in scored)
    # the fast rank waits for the slow one in the all-reduce, the slow one does not wait
    assert all(r["collective_wait_max_s"] > 0.1 for r in scored) and first["collective_s"] < 0.1


def test_one_rank_per_node_names_the_node(gang):
    records, log = gang
    named = [r for r in records["nodes"] if r.get("stragglers")]
    assert named and named[0]["step"] <= 10
    for r in named:
        assert [(s["kind"], s["node"], s["ranks"]) for s in r["stragglers"]] == [("node", 1, [1])]
    assert "straggler: node 1 (host " in log and ", rank 1) at 0." in log


def test_a_gang_of_equal_ranks_names_nobody(gang):
    records, log = gang
    equal = records["equal"]
    assert [("straggler_score" in r) for r in equal] == [False, True, True, True]  # the first window is warm-up
    assert not any("stragglers" in r for r in equal), [r["straggler_score"] for r in equal[1:]]
    assert all(r["compute_s"] > 0.05 for r in equal[1:])
    lines = [line for line in log.splitlines() if "straggler:" in line]
    assert len(lines) == 2 and "rank 1" in lines[0] and "node 1" in lines[1], lines  # the slowed jobs' only
