"""The gang preflight on a real local gang (2 nodes x 2 processes, gloo): a node that fails a check stops the
run in seconds, named, and @retry(times=2) does not run it again; `--no-preflight` skips it."""

from __future__ import annotations

import re
import time

import pytest

from tests.helpers import run_flow

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def test_every_node_checks_itself_before_the_command(tmp_path):
    """A local gang (every node on this machine): each node runs the local checks, starting one Python (the imports
    check), and skips the all_reduce (loopback); then its ranks are forked from its warm launcher, not torchrun."""
    p = run_flow("preflight_flow.py", "run", cwd=tmp_path)
    lines = [ln for ln in p.stdout.splitlines() if "preflight: node" in ln]
    assert len(lines) == 2, p.stdout
    for node in (0, 1):
        line = next(ln for ln in lines if f"preflight: node {node} (" in ln)
        assert re.search(r"ok in [0-9.]+ s: no accelerator asked, imports ok, data ok \(1 paths\), disk \d+ GB free, "
                         r"all_reduce skipped \(every node is on this machine\); 1 Python started$", line), line
        assert re.search(rf"stoker: node {node} runs 2 rank\(s\) forked from the warm launcher \([0-9.]+ s of "
                         r"imports done before\) in [0-9.]+ s: -m stoker.train.collectives", p.stdout), p.stdout[-3000:]
    assert "torch.distributed.run" not in p.stdout
    for node in (0, 1):  # torchrun's --tee=3 prefix is the local rank: each node's first rank prints, as [default0]
        assert re.search(rf"/train/\d+\] \[default0\]:result OK: node rank {node}, world size 4", p.stdout), \
            p.stdout[-3000:]
    assert "attempts [0]" in p.stdout


def test_warm_ranks_off_runs_torchrun_and_a_floor_runs_the_all_reduce_here(tmp_path):
    env = {"STOKER_WARM_RANKS": "0", "STOKER_PREFLIGHT_MIN_BUSBW_GBPS": "0"}
    p = run_flow("preflight_flow.py", "run", cwd=tmp_path, env=env)
    assert re.search(r"stoker: node 0 runs: \S+ -m torch.distributed.run --nnodes=2 --node_rank=0", p.stdout), \
        p.stdout[-3000:]
    assert "forked from the warm launcher" not in p.stdout
    lines = [ln for ln in p.stdout.splitlines() if "preflight: node" in ln]
    assert len(lines) == 2 and all(re.search(r"all_reduce [0-9.]+ GB/s ≥ 0 \(.*\); 4 Pythons started$", ln)
                                   for ln in lines), lines


def test_a_node_missing_its_staged_data_stops_the_run_without_a_retry(tmp_path):
    t0 = time.time()
    p = run_flow("preflight_flow.py", "run", "--unstaged_node", "1", cwd=tmp_path, check=False)
    took = time.time() - t0
    out = p.stdout + p.stderr
    assert p.returncode == 1 and took < 30, (took, out[-3000:])
    assert "preflight failed on node 1 (" in out and "check staged data" in out and "staged is missing" in out
    assert "failed after 1 attempt(s): PreflightError" in out and "not retried" in out
    assert "node 1 attempt 1" not in out and "retry 1 of 2" not in out


def test_an_all_reduce_below_the_floor_fails_and_no_preflight_skips_it(tmp_path):
    env = {"STOKER_PREFLIGHT_MIN_BUSBW_GBPS": "1e9"}
    p = run_flow("preflight_flow.py", "run", cwd=tmp_path, env=env, check=False)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-3000:]
    assert re.search(r"preflight failed on node \d \(.*\), check all_reduce: all_reduce bus bandwidth [0-9.]+ GB/s "
                     r"\(gloo, 4 ranks\) is below the required 1e\+09 GB/s", out), out[-3000:]
    assert "attempt 1" not in out
    p = run_flow("preflight_flow.py", "run", "--no-preflight", cwd=tmp_path, env=env)
    assert "preflight:" not in p.stdout and "attempts [0]" in p.stdout
