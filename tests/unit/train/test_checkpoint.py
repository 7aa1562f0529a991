"""Committed checkpoints: manifest + checksums, ``latest``, keep-K, torn/corrupted checkpoints never
loaded, another config refused, exact single-process resume (sync, async, fsspec URL)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from stoker.errors import CheckpointError, ConfigError
from stoker.train.checkpoint_signing import sign_manifest
from stoker.train.trainer import run_training

torch.set_num_threads(1)


@pytest.fixture
def tokens(tmp_path: Path) -> Path:
    rng = np.random.default_rng(1)
    base = rng.integers(0, 256, size=97)
    path = tmp_path / "tokens.bin"
    np.concatenate([np.roll(base, i % 5) for i in range(22)]).astype(np.uint16).tofile(path)
    return path


def cfg(out: Path, tokens: Path, **sections) -> dict:
    base = {"out_dir": str(out), "data": {"url": str(tokens), "block_size": 33},
            "train": {"steps": 5, "micro_batch_size": 4, "lr": 3e-3, "log_every": 5},
            "metrics": {"progress": False, "tensorboard": False}}
    for key, value in sections.items():
        base.setdefault(key, {}).update(value)
    return base


def weights(ckpt: str) -> dict[str, torch.Tensor]:
    import torch.distributed.checkpoint as dcp

    from stoker.train.model import Llama
    from stoker.train.settings import get_model_config

    state = {"model": Llama(get_model_config("tiny")).state_dict()}
    dcp.load(state, checkpoint_id=ckpt)
    return state["model"]


def test_manifest_latest_and_keep(tmp_path: Path, tokens: Path):
    r = run_training(cfg(tmp_path / "a", tokens, checkpoint={"every": 1, "keep": 2}))
    ck = Path(r["checkpoint_dir"])
    assert sorted(p.name for p in ck.iterdir()) == ["latest", "step_00000004", "step_00000005"]
    assert (ck / "latest").read_text() == "step_00000005"
    manifest = json.loads((ck / "step_00000005" / "manifest.json").read_text())
    assert manifest["step"] == 5 and ".metadata" in manifest["files"]
    assert all(len(f["sha256"]) == 64 and f["bytes"] > 0 for f in manifest["files"].values())
    assert manifest["fingerprint"]["model"]["dim"] == 64 and manifest["config"]["train"]["steps"] == 5


def test_resume_is_bitwise(tmp_path: Path, tokens: Path):
    full = run_training(cfg(tmp_path / "full", tokens))
    first = run_training(cfg(tmp_path / "part", tokens, train={"stop_after": 2}))
    assert first["step"] == 2
    second = run_training(cfg(tmp_path / "part", tokens))
    assert second["resumed_from"].endswith("step_00000002")
    assert second["losses"] == full["losses"][2:]
    a, b = weights(full["checkpoint"]), weights(second["checkpoint"])
    assert all(torch.equal(a[k], b[k]) for k in a)
    # an explicit resume_from (what a retried flow step passes) works from another folder too
    third = run_training(cfg(tmp_path / "other", tokens), resume_from=str(tmp_path / "part" / "checkpoints"))
    assert third["resumed_from"].endswith("step_00000005") and third["losses"] == []


def test_async_save_and_fsspec_url(tmp_path: Path, tokens: Path):
    full = run_training(cfg(tmp_path / "full", tokens))
    url = f"memory://{tmp_path.name}/ck"
    run_training(cfg(tmp_path / "m", tokens, train={"stop_after": 3}, checkpoint={"dir": url, "async_save": True}))
    resumed = run_training(cfg(tmp_path / "m", tokens, checkpoint={"dir": url, "async_save": True}))
    assert resumed["resumed_from"] == f"{url}/step_00000003"
    assert resumed["losses"] == full["losses"][3:]


def test_corrupted_and_torn_checkpoints_are_never_loaded(tmp_path: Path, tokens: Path):
    r = run_training(cfg(tmp_path / "a", tokens, checkpoint={"every": 2}))
    ck = Path(r["checkpoint_dir"])
    shard = next((ck / "step_00000005").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="does not match its checksum"):
        run_training(cfg(tmp_path / "b", tokens, train={"steps": 6}), resume_from=str(ck / "step_00000005"))
    # auto-resume skips the corrupted one and takes the newest valid checkpoint
    auto = run_training(cfg(tmp_path / "a", tokens, train={"steps": 6}))
    assert auto["resumed_from"].endswith("step_00000004") and len(auto["losses"]) == 2
    # a folder without a manifest (a torn write) is not a checkpoint
    (ck / "step_00000009").mkdir()
    (ck / "step_00000009" / ".metadata").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="never committed"):
        run_training(cfg(tmp_path / "c", tokens, train={"steps": 10}), resume_from=str(ck / "step_00000009"))


def test_checkpoint_from_another_config(tmp_path: Path, tokens: Path):
    r = run_training(cfg(tmp_path / "a", tokens, train={"steps": 2}))
    other = cfg(tmp_path / "b", tokens, model={"ffn_dim": 128}, train={"steps": 4})
    with pytest.raises(CheckpointError, match="another configuration.*model"):
        run_training(other, resume_from=r["checkpoint"])
    with pytest.raises(CheckpointError, match="no checkpoint there"):
        run_training(other, resume_from=str(tmp_path / "nowhere"))


def test_init_from_checkpoint_and_hf_folder(tmp_path: Path, tokens: Path):
    from stoker.train import hf

    base = run_training(cfg(tmp_path / "base", tokens, train={"steps": 3}))
    fresh = run_training(cfg(tmp_path / "fresh", tokens, train={"steps": 2}))
    tuned = run_training(cfg(tmp_path / "ft", tokens, model={"init_from": base["checkpoint"]}, train={"steps": 2}))
    assert tuned["resumed_from"] is None and tuned["losses"][0] < fresh["losses"][0] - 0.05
    model_cfg, state, _ = hf.load_checkpoint_weights(base["checkpoint"])
    hf.export_hf(state, model_cfg, tmp_path / "hf", dtype=torch.float32)
    via_hf = run_training(cfg(tmp_path / "ft_hf", tokens, model={"init_from": str(tmp_path / "hf")},
                              train={"steps": 2}))
    assert via_hf["losses"] == tuned["losses"]
    run_cfg = json.loads((tmp_path / "ft" / "config.json").read_text())
    assert run_cfg["model"]["init_from"] == base["checkpoint"] and run_cfg["model_shape"]["dim"] == 64
    with pytest.raises(CheckpointError, match="shape"):
        run_training(cfg(tmp_path / "bad", tokens, model={"init_from": base["checkpoint"], "ffn_dim": 128}))


def test_resume_refusals_name_the_fix(tmp_path: Path, tokens: Path):
    """A checkpoint of an earlier format, or of another global batch size, is refused before loading."""
    first = run_training(cfg(tmp_path / "a", tokens, train={"steps": 2, "global_batch_size": 8}))
    with pytest.raises(CheckpointError, match="global batch of 8 sequences.*--global-batch-size 8"):
        run_training(cfg(tmp_path / "b", tokens, train={"steps": 4, "global_batch_size": 4}),
                     resume_from=first["checkpoint"])
    manifest_path = Path(first["checkpoint"]) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["fingerprint"] = {"model": manifest["fingerprint"]["model"], "dp": 1, "tp": 1, "dp_mode": "none"}
    manifest_path.write_text(json.dumps(sign_manifest(manifest)))  # what the previous format wrote (signed)
    with pytest.raises(CheckpointError, match="earlier stoker version.*resume=.never"):
        run_training(cfg(tmp_path / "c", tokens, train={"steps": 4, "global_batch_size": 8}),
                     resume_from=first["checkpoint"])


def test_init_from_without_a_model_name_takes_the_sources_shape(tmp_path: Path, tokens: Path):
    """Fine-tuning a model of another shape needs only init_from: the shape comes from the checkpoint's
    manifest or the Hugging Face folder's config.json (explicit [model] settings still override it)."""
    from stoker.train import hf

    base = run_training(cfg(tmp_path / "base", tokens, model={"ffn_dim": 96, "n_layers": 3}, train={"steps": 2}))
    model_cfg, state, _ = hf.load_checkpoint_weights(base["checkpoint"])
    hf.export_hf(state, model_cfg, tmp_path / "hf", dtype=torch.float32)
    for source in (base["checkpoint"], str(tmp_path / "hf")):
        tuned = run_training(cfg(tmp_path / f"ft{len(source)}", tokens, model={"init_from": source},
                                 train={"steps": 1}))
        shape = json.loads((tmp_path / f"ft{len(source)}" / "config.json").read_text())["model_shape"]
        assert (shape["ffn_dim"], shape["n_layers"]) == (96, 3) and tuned["step"] == 1
    with pytest.raises(ConfigError, match="init_from=.*nowhere.*give a Hugging Face folder"):
        run_training(cfg(tmp_path / "bad", tokens, model={"init_from": str(tmp_path / "nowhere")}))


@pytest.mark.aws
def test_checkpoints_on_s3_commit_in_place_and_resume_bitwise(tmp_path: Path, tokens: Path, aws):
    """On an object store a checkpoint is written where it stays and committed by its manifest (no copy of
    the whole checkpoint); an uncommitted one is skipped. moto's S3 on loopback."""
    s3 = aws.client("s3")
    s3.create_bucket(Bucket="ckpt-bucket")
    url = "s3://ckpt-bucket/run/ck"
    full = run_training(cfg(tmp_path / "full", tokens))
    run_training(cfg(tmp_path / "s", tokens, train={"stop_after": 3}, checkpoint={"dir": url, "every": 1}))
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="ckpt-bucket")["Contents"]}
    assert not any("/.tmp-" in k for k in keys), "no temporary copy on S3"
    assert "run/ck/step_00000003/manifest.json" in keys and "run/ck/latest" in keys
    # a save torn before its manifest: its files are there, it is not a checkpoint
    s3.put_object(Bucket="ckpt-bucket", Key="run/ck/step_00000004/.metadata", Body=b"torn")
    resumed = run_training(cfg(tmp_path / "s", tokens, checkpoint={"dir": url}))
    assert resumed["resumed_from"] == f"{url}/step_00000003"
    assert resumed["losses"] == full["losses"][3:]
    a, b = weights(full["checkpoint"]), weights(resumed["checkpoint"])
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("damage", ["truncated", "not_a_manifest", "pointer_is_a_path"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path: Path, tokens: Path, damage: str):
    """A truncated manifest (or one that is not a manifest, or a `latest` holding a path) used to crash
    auto-resume with a JSON traceback: the newest valid checkpoint is used instead, and export refuses in one line."""
    from stoker.train.hf import export_from_checkpoint

    r = run_training(cfg(tmp_path / "a", tokens, checkpoint={"every": 2}))
    ck = Path(r["checkpoint_dir"])
    newest = ck / "step_00000005" / "manifest.json"
    if damage == "truncated":
        newest.write_text(newest.read_text()[:40])
    elif damage == "not_a_manifest":
        newest.write_text('["a list"]')
    else:
        (ck / "latest").write_text("../../etc")
        (ck / "step_00000005" / "manifest.json").unlink()
    auto = run_training(cfg(tmp_path / "a", tokens, train={"steps": 6}))
    assert auto["resumed_from"].endswith("step_00000004") and len(auto["losses"]) == 2
    if damage != "pointer_is_a_path":
        with pytest.raises(CheckpointError, match="step_00000005/manifest.json"):
            export_from_checkpoint(str(ck / "step_00000005"), tmp_path / "out")
