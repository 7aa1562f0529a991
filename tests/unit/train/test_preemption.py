"""Preemption of a real torchrun gang (2 ranks, gloo, the tiny model): a real SIGTERM to torchrun mid-training
reaches both workers, which agree on the step, commit a checkpoint of it and exit with 75; the launching task
(TorchrunHelper) turns that into Preempted(step). Running again resumes from that checkpoint and ends with losses
and weights bitwise equal to an uninterrupted run. A misspelt setting inside the gang comes back as a permanent
ConfigError (exit code 78 through $STOKER_EXIT_STATUS_DIR), which the scheduler never retries."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch

from stoker.distributed.torchrun import TorchrunHelper
from stoker.errors import ConfigError, Preempted
from tests.unit.train.test_parallel import load_weights, token_file

STEPS = 30


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _helper() -> TorchrunHelper:
    return TorchrunHelper(nnodes=1, node_rank=0, master_addr="127.0.0.1", master_port=_port(), nproc_per_node=2,
                          tee=False)


def _config(tmp: Path, data: Path, name: str) -> Path:
    out = tmp / name
    path = tmp / f"{name}.toml"
    path.write_text(f"""out_dir = "{out}"
[data]
url = "{data}"
block_size = 33
[train]
steps = {STEPS}
micro_batch_size = 4
global_batch_size = 8
lr = 3e-3
warmup_steps = 2
log_every = 1
seed = 5
[metrics]
progress = false
tensorboard = false
""")
    return path


def _train(tmp: Path, cfg: Path, name: str) -> dict:
    result = tmp / f"{name}.json"
    _helper().run("stoker.train", args=["--config", str(cfg), f"--result-file={result}"],
                  env={"OMP_NUM_THREADS": "1"})
    return json.loads(result.read_text())


def _sigterm_torchrun_at(metrics: Path, step: int, sent: list) -> None:
    """Wait for the metrics to show `step`, then SIGTERM the torchrun agent (not its workers)."""
    deadline = time.time() + 120
    while time.time() < deadline:
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        if lines and json.loads(lines[-1]).get("step", 0) >= step:
            break
        time.sleep(0.02)
    for p in psutil.Process().children(recursive=True):
        if "torch.distributed.run" in " ".join(p.cmdline()):
            p.send_signal(signal.SIGTERM)
            sent.append(p.pid)


@pytest.mark.slow
def test_sigterm_to_torchrun_checkpoints_exits_75_and_resumes_bitwise(tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_WARM_RANKS", "0")  # torchrun, not ranks forked from a warm launcher (a local default)
    data = token_file(tmp_path / "tokens.bin")
    full = _train(tmp_path, _config(tmp_path, data, "full"), "full")
    cfg = _config(tmp_path, data, "preempted")
    sent: list[int] = []
    t = threading.Thread(target=_sigterm_torchrun_at, args=(tmp_path / "preempted" / "metrics.jsonl", 3, sent))
    t.start()
    with pytest.raises(Preempted) as info:
        _train(tmp_path, cfg, "preempted")
    t.join()
    assert sent, "torchrun was never seen"
    stopped_at = info.value.step
    assert 3 <= stopped_at < STEPS, stopped_at
    ckpts = tmp_path / "preempted" / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == f"step_{stopped_at:08d}"  # committed at the step it was on
    resumed = _train(tmp_path, cfg, "preempted")
    assert resumed["resumed_from"].endswith(f"step_{stopped_at:08d}") and resumed["step"] == STEPS
    assert resumed["losses"] == full["losses"][stopped_at:]  # exact, not approximate
    a, b = load_weights(full["checkpoint"]), load_weights(resumed["checkpoint"])
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_a_misspelt_setting_in_the_gang_is_a_permanent_config_error(tmp_path):
    data = token_file(tmp_path / "tokens.bin")
    cfg = _config(tmp_path, data, "bad")
    t0 = time.time()
    with pytest.raises(ConfigError) as info:
        _helper().run("stoker.train", args=["--config", str(cfg), "--set", "train.stepz=5"],
                      env={"OMP_NUM_THREADS": "1"})
    assert info.value.permanent and "train.stepz" in str(info.value) and time.time() - t0 < 60
