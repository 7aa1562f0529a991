"""Export a committed training checkpoint (stoker.train's trainer) to Hugging Face format."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import transformers
from safetensors.torch import load_file

from stoker.errors import CheckpointError
from stoker.train.config import from_dict
from stoker.train.hf import export_from_checkpoint, export_hf, load_checkpoint_weights
from stoker.train.hf import main as hf_main
from stoker.train.trainer import Trainer


def _config(tmp: Path, **parallel) -> object:
    tokens = tmp / "tokens.bin"
    if not tokens.exists():
        np.random.default_rng(0).integers(0, 256, 20_000, dtype=np.uint16).tofile(tokens)
    return from_dict({
        "out_dir": str(tmp / "run"), "data": {"url": str(tokens), "block_size": 33},
        "model": {"name": "tiny", "tie_embeddings": True},
        "train": {"steps": 3, "micro_batch_size": 4, "log_every": 1, "accelerator": "cpu"},
        "parallel": parallel, "metrics": {"progress": False, "tensorboard": False},
    })


def test_export_from_trainer_checkpoint_matches_trained_model(tmp_path):
    trainer = Trainer(_config(tmp_path))
    result = trainer.fit()
    ckpt_dir = Path(result["checkpoint_dir"])
    out = export_from_checkpoint(ckpt_dir, tmp_path / "hf", dtype=torch.float32)  # via `latest`
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert hf.config.tie_word_embeddings is True
    x = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, trainer.model.eval()(x), rtol=1e-5, atol=2e-5)
    # a step folder works too, and the weights moved away from the initial ones (training happened)
    cfg, weights, manifest = load_checkpoint_weights(result["checkpoint"])
    assert manifest["step"] == 3 and cfg.tie_embeddings
    assert torch.equal(weights["layers.0.attention.wq.weight"], trainer.model.layers["0"].attention.wq.weight)
    # the command line does the same
    assert hf_main([str(ckpt_dir), str(tmp_path / "cli"), "--dtype", "float32"]) == 0
    cli = load_file(str(tmp_path / "cli" / "model.safetensors"))
    assert torch.equal(cli["model.norm.weight"], load_file(str(out / "model.safetensors"))["model.norm.weight"])
    assert hf_main([str(tmp_path / "nope"), str(tmp_path / "cli2")]) == 1


def test_corrupt_or_missing_checkpoints_are_refused(tmp_path):
    with pytest.raises(CheckpointError, match="no committed checkpoint"):
        export_from_checkpoint(tmp_path / "nothing", tmp_path / "hf")
    result = Trainer(_config(tmp_path)).fit()
    shard = next(Path(result["checkpoint"]).glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum"):
        export_from_checkpoint(result["checkpoint"], tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def _tp_worker(rank: int, tmp: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/init", rank=rank, world_size=2)
    try:
        trainer = Trainer(_config(Path(tmp), tp=2))
        trainer.fit()
        export_hf(trainer.model, trainer.model_cfg, Path(tmp) / "live", dtype=torch.float32)  # gathers TP shards
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_export_from_tensor_parallel_checkpoint(tmp_path):
    mp.spawn(_tp_worker, args=(str(tmp_path),), nprocs=2, join=True)
    out = export_from_checkpoint(tmp_path / "run" / "checkpoints", tmp_path / "hf", dtype=torch.float32)
    got, want = load_file(str(out / "model.safetensors")), load_file(str(tmp_path / "live" / "model.safetensors"))
    assert set(got) == set(want) and "lm_head.weight" not in got
    for k in want:
        assert torch.equal(got[k], want[k]), k
