"""benchmarks/train_gpu.py stays runnable: its CPU smoke mode reports tokens/s for both recipes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_train_gpu_benchmark_smoke_on_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "train_gpu.py"), "--device", "cpu", "--tiny", "--steps", "1",
         "--warmup", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(out.read_text())
    assert summary["accelerator"] == "cpu" and summary["peak_bf16_tflops"] is None
    assert [r["model"] for r in summary["results"]] == ["1b", "8b"]
    for r in summary["results"]:
        assert "error" not in r, r
        assert r["tokens_per_s"] > 0 and r["mfu"] is None and r["flops_per_token"] > 0
    assert summary["results"][0]["param_dtype"] == "float32"
    assert summary["results"][1]["param_dtype"] == "bfloat16"
