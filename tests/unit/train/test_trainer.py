"""Single-process trainer: config loading and overrides, learning, accumulation, metrics, bad input."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from stoker.errors import ConfigError, DataError, TrainingError
from stoker.train.__main__ import parse_args
from stoker.train.config import from_dict, load_config
from stoker.train.optim import lr_at
from stoker.train.parallel import ParallelDims
from stoker.train.settings import get_model_config
from stoker.train.trainer import run_training

torch.set_num_threads(1)


@pytest.fixture
def tokens(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, size=97)
    path = tmp_path / "tokens.bin"
    np.concatenate([np.roll(base, i % 5) for i in range(22)]).astype(np.uint16).tofile(path)  # 64 x 33
    return path


def cfg(tmp_path: Path, tokens: Path, **sections) -> dict:
    out = {"out_dir": str(tmp_path / "run"), "data": {"url": str(tokens), "block_size": 33},
           "train": {"steps": 4, "micro_batch_size": 4, "lr": 3e-3, "log_every": 2},
           "metrics": {"progress": False, "tensorboard": False}}
    for key, value in sections.items():
        out.setdefault(key, {}).update(value)
    return out


def test_toml_and_overrides(tmp_path: Path):
    path = tmp_path / "run.toml"
    path.write_text('out_dir = "x"\n[model]\nname = "tiny"\nmax_seq_len = 64\n[train]\nlr = 1e-3\nsteps = 7\n'
                    '[parallel]\ntp = 2\n')
    config = load_config(path, ["train.lr=3e-4", "data.url=/data/a b.bin", "checkpoint_dir=s3://b/ck", "steps=9"])
    assert config.train.lr == 3e-4 and config.train.steps == 9 and config.parallel.tp == 2
    assert config.data.url == "/data/a b.bin" and config.checkpoint_dir == "s3://b/ck"
    assert config.model.resolve().max_seq_len == 64
    assert config.metrics_path == str(Path("x") / "metrics.jsonl")
    flat = from_dict({"data": "/d", "model": "small", "steps": 3, "checkpoint_dir": "/ck", "resume_from": "/ck/x",
                      "tp": 2, "train": {"lr": 1e-3}})
    assert (flat.data.url, flat.model.name, flat.train.steps, flat.train.lr) == ("/d", "small", 3, 1e-3)
    assert (flat.checkpoint_dir, flat.checkpoint.resume_from, flat.parallel.tp) == ("/ck", "/ck/x", 2)
    path_, overrides, _ = parse_args(["--config", "a.toml", "--set", "train.lr=1", "--train.seed", "3",
                                      "--resume-from=/ck", "--data", "d.bin"])
    assert path_ == "a.toml"
    assert overrides == ["train.lr=1", "train.seed=3", "resume_from=/ck", "data=d.bin"]


@pytest.mark.parametrize("bad, match", [
    (["train.lrr=1"], "unknown setting"),
    (["train.schedule=exp"], "train.schedule"),
    (["parallel.dp_mode=ddp3"], "dp_mode"),
    (["model.name=llama9"], "unknown model config"),
    (["model.n_kv_heads=3"], "n_kv_heads"),
    (["lr"], "section.key=value"),
])
def test_bad_settings(bad, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, bad)


def test_parallel_dims_errors():
    with pytest.raises(ConfigError, match="not divisible by parallel.tp=3"):
        ParallelDims(dp=-1, tp=3, world_size=2)
    with pytest.raises(ConfigError, match=r"dp \(2\) x parallel.tp \(2\)"):
        ParallelDims(dp=2, tp=2, world_size=2)
    dims = ParallelDims(dp=1, tp=4, world_size=4)
    with pytest.raises(ConfigError, match="tp=4 does not divide model.n_kv_heads=2"):
        dims.validate_model(get_model_config("tiny"))
    with pytest.raises(ConfigError, match="sequence parallel"):
        ParallelDims(dp=1, tp=2, world_size=2).validate_model(get_model_config("tiny"), seq_len=33,
                                                              sequence_parallel=True)


def test_lr_schedule():
    kw = {"lr": 1.0, "min_lr": 0.1, "warmup": 2, "total": 10}
    assert [lr_at(s, schedule="cosine", **kw) for s in (0, 1)] == [0.5, 1.0]
    assert math.isclose(lr_at(10, schedule="cosine", **kw), 0.1)
    assert math.isclose(lr_at(6, schedule="linear", **kw), 0.55)
    assert lr_at(9, schedule="constant", **kw) == 1.0


def test_trains_logs_and_accumulates(tmp_path: Path, tokens: Path):
    a = run_training(cfg(tmp_path / "a", tokens, train={"steps": 6, "global_batch_size": 8},
                         metrics={"progress": True, "tensorboard": True}))
    assert a["step"] == 6 and a["global_batch_size"] == 8 and a["seq_len"] == 32
    assert a["losses"][-1] < a["losses"][0] - 0.2
    lines = [json.loads(x) for x in Path(a["metrics_path"]).read_text().splitlines()]
    assert [x["step"] for x in lines] == [2, 4, 6]
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "flops_per_s", "mem_used_bytes"):
        assert key in lines[-1], key
    # micro-batch 4 x 2 accumulation == micro-batch 8 in one go (same data order)
    b = run_training(cfg(tmp_path / "b", tokens, train={"steps": 6, "micro_batch_size": 8}))
    np.testing.assert_allclose(a["losses"], b["losses"], atol=1e-5)


def test_activation_checkpointing_keeps_losses(tmp_path: Path, tokens: Path):
    ref = run_training(cfg(tmp_path / "a", tokens))
    for mode in ("full", "selective"):
        got = run_training(cfg(tmp_path / mode, tokens, parallel={"activation_checkpoint": mode}))
        np.testing.assert_allclose(got["losses"], ref["losses"], atol=1e-6)


def test_bf16_autocast_trains(tmp_path: Path, tokens: Path):
    ref = run_training(cfg(tmp_path / "a", tokens))
    got = run_training(cfg(tmp_path / "b", tokens, parallel={"precision": "bf16"}))
    np.testing.assert_allclose(got["losses"], ref["losses"], atol=0.05)


def test_sequence_longer_than_model(tmp_path: Path, tokens: Path):
    with pytest.raises(ConfigError, match="max_seq_len=16"):
        run_training(cfg(tmp_path, tokens, model={"max_seq_len": 16}))


def test_missing_data(tmp_path: Path, tokens: Path):
    with pytest.raises(DataError, match="does not exist"):
        run_training(cfg(tmp_path, tmp_path / "nope.bin"))
    with pytest.raises(DataError, match="no such file or folder"):
        run_training(cfg(tmp_path, tmp_path / "nope_dataset"))
    with pytest.raises(DataError, match="data.url is not set"):
        run_training(cfg(tmp_path, tokens, data={"url": ""}))


def test_tp_degree_without_ranks(tmp_path: Path, tokens: Path):
    with pytest.raises(ConfigError, match="world size 1 is not divisible by parallel.tp=2"):
        run_training(cfg(tmp_path, tokens, parallel={"tp": 2}))


def test_nan_loss_stops_with_step_and_hint(tmp_path: Path, tokens: Path):
    bad = cfg(tmp_path, tokens, train={"steps": 10, "lr": 1e30, "grad_clip": 0.0, "schedule": "constant",
                                       "weight_decay": 0.0})
    with pytest.raises(TrainingError, match=r"loss is nan at step \d+.*hint: lower train.lr"):
        run_training(bad)


def test_close_lets_go_of_everything_that_holds_a_process_group(tmp_path: Path, tokens: Path):
    """run_training closes its trainer before the group is destroyed, so that destroy_process_group frees the
    groups (and joins their gloo threads; test_parallel checks that none is left) while the interpreter runs."""
    from stoker.train.config import as_config
    from stoker.train.trainer import Trainer

    trainer = Trainer(as_config(cfg(tmp_path, tokens, train={"steps": 2}, checkpoint={"async_save": True})))
    assert trainer.fit()["checkpoint"].endswith("step_00000002")
    checkpointer = trainer.checkpointer
    assert checkpointer._executor is not None  # the async save's thread
    trainer.close()
    assert checkpointer._executor is None and checkpointer._async_group is None and checkpointer._pending is None
    for name in ("checkpointer", "model", "optimizer", "schedule", "dp_group"):
        assert name not in vars(trainer), name
    assert trainer.dims.mesh is None
    trainer.close()  # twice is harmless


def test_cli_entrypoint(tmp_path: Path, tokens: Path):
    proc = subprocess.run(
        [sys.executable, "-m", "stoker.train", "--data", str(tokens), "--data.block_size", "33", "--steps", "2",
         "--out-dir", str(tmp_path / "cli"), "--set", "metrics.progress=false", "--train.micro_batch_size=4"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]  # a human summary, not a JSON blob
    assert last.startswith("stoker.train: 2 steps, final loss ") and "tokens/s" in last and "step_00000002" in last
    assert "{" not in proc.stdout and "losses" not in proc.stdout
    result = json.loads((tmp_path / "cli" / "result.json").read_text())  # the machine-readable result
    assert result["step"] == 2 and result["checkpoint"].endswith("step_00000002") and result["seconds"] > 0
    again = subprocess.run(  # --json: the result as one JSON line, for scripts (all steps done: returns at once)
        [sys.executable, "-m", "stoker.train", "--data", str(tokens), "--data.block_size", "33", "--steps", "2",
         "--out-dir", str(tmp_path / "cli"), "--set", "metrics.progress=false", "--train.micro_batch_size=4",
         "--json"], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout.strip().splitlines()[-1])["step"] == 2


def test_cli_error_is_one_line(tmp_path: Path, capsys):
    from stoker.train.__main__ import main

    assert main(["--data", str(tmp_path / "missing.bin")]) == 1
    err = capsys.readouterr().err
    assert "error: token file" in err and "Traceback" not in err
    assert main(["--train.lr"]) == 78 and "needs a value" in capsys.readouterr().err  # EX_CONFIG: not retried
