"""examples/allreduce.py: a real torchrun gang (2 nodes x 2 processes, gloo) validating all_reduce."""

from __future__ import annotations

import time

import pytest

from stoker import Flow
from tests.helpers import EXAMPLES, run_flow

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def test_allreduce_gang_reports_ok_and_bandwidth(tmp_path):
    p = run_flow(EXAMPLES / "allreduce.py", "run", "--nodes", "2", "--nproc", "2", "--sizes", "4K,1M",
                 "--iters", "3", cwd=tmp_path)
    assert p.stdout.count("result OK") == 2, "local rank 0 of each node prints result OK"
    assert "world size 4" in p.stdout
    report = Flow("AllReduceFlow").latest_run["end"].task.data.report
    assert report["world_size"] == 4 and [r["bytes"] for r in report["results"]] == [4096, 1 << 20]
    assert all(r["busbw_gbps"] > 0 and r["latency_us"] > 0 for r in report["results"])


def test_allreduce_fails_loudly_on_a_wrong_value(tmp_path):
    p = run_flow(EXAMPLES / "allreduce.py", "run", "--nodes", "2", "--nproc", "1", "--sizes", "4K", "--iters", "2",
                 "--extra", "--corrupt-rank 1", cwd=tmp_path, check=False)
    assert p.returncode == 1
    assert "expected the world size 2" in p.stdout + p.stderr


def test_allreduce_hang_is_cut_by_the_watchdog(tmp_path):
    t0 = time.time()
    p = run_flow(EXAMPLES / "allreduce.py", "run", "--nodes", "2", "--nproc", "1", "--sizes", "4K", "--iters", "2",
                 "--timeout", "8", "--extra", "--hang-rank 0", cwd=tmp_path, check=False)
    assert p.returncode == 1 and time.time() - t0 < 60
    assert "did not finish within 8 s" in p.stdout + p.stderr
