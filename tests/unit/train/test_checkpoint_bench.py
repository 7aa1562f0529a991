"""benchmarks/checkpoint.py stays runnable: a tiny state saved and resumed on local disk and on moto's S3 (the
script starts its own moto server on loopback), every row and the goal verdict in its JSON output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
ROWS = ["torch.save", "torch.load", "sync save", "async first save()", "async save()", "async wait()",
        "async committed", "inspect", "latest", "load", "resume"]
TRANSFER = ["boto3 upload_file", "boto3 download_file", "stoker put_file", "stoker get_file", "torch.save + upload",
            "download + torch.load"]  # benchmarks/checkpoint_transfer.py: stoker vs boto3's defaults (issue 15)


@pytest.mark.slow
@pytest.mark.aws
def test_checkpoint_benchmark_smoke_local_and_s3(tmp_path):
    pytest.importorskip("moto.server")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    for var in ("AWS_ENDPOINT_URL", "STOKER_S3_ENDPOINT_URL", "AWS_PROFILE"):
        env.pop(var, None)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "checkpoint.py"), "--size-mb", "4", "--quick", "--json",
         "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert 3.5e6 < result["bytes"] < 4.5e6 and result["repeat"] == 1
    for target in ("local", "s3"):
        rows = [r for r in result["rows"] if r["target"] == target]
        assert [r["what"] for r in rows] == ROWS + (TRANSFER if target == "s3" else [])
        assert all(len(r["seconds"]) == 1 for r in rows), rows
        assert all(r["median_s"] > 0 for r in rows if r["what"] != "async wait()"), rows  # wait() only joins
        assert all(r["gb_per_s"] > 0 for r in rows if "bytes" in r)
        s = result["targets"][target]
        assert s["goal"] in ("ok", "MISS") and s["async_blocked_s"] > 0 and s["resume_s"] > 0
        assert s["async_first_save_s"] > 0
    assert result["transfer"]["put_file_vs_boto3_upload_file"] > 0
    assert result["transfer"]["checkpoint_load_vs_download_plus_torch_load"] > 0
    assert list(tmp_path.iterdir()) == [], "the benchmark cleans up its temporary folder"
