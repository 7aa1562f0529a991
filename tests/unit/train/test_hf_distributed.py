"""Export from a model sharded over 2 gloo ranks (FSDP2, and DTensor tensor-parallel placements) writes the
same folder as an export of the unsharded model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file

from stoker.train.hf import export_hf
from stoker.train.model import Llama, LlamaConfig

CFG = LlamaConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, ffn_dim=48, max_seq_len=32)
TIED = LlamaConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, ffn_dim=48, max_seq_len=32,
                   tie_embeddings=True)


def _model(cfg: LlamaConfig) -> Llama:
    model = Llama(cfg)
    model.init_weights(7)
    return model


def _worker(rank: int, world: int, init_file: str, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        # FSDP2: every parameter is a DTensor sharded on dim 0
        for name, cfg in (("fsdp", CFG), ("fsdp_tied", TIED)):
            model = _model(cfg)
            for layer in model.layers.values():
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            assert all(type(p).__name__ == "DTensor" for p in model.parameters())
            res = export_hf(model, cfg, Path(out) / name, dtype=torch.float32)
            assert (res is not None) == (rank == 0)
        # tensor-parallel style placements in a state dict: column (Shard 0), row (Shard 1), replicated
        sd = {}
        for k, v in _model(CFG).state_dict().items():
            place = Shard(1) if (".wo." in k or ".w2." in k) else Replicate() if "norm" in k else Shard(0)
            sd[k] = distribute_tensor(v, mesh, [place])
        export_hf(sd, CFG, Path(out) / "tp", dtype=torch.float32)
        # rank 1 is done first (rank 0 still writes the files): no rank tears its connections down while another
        # still holds them (gloo aborted rank 1 with "terminate called without an active exception", once in CI)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_sharded_export_equals_unsharded(tmp_path):
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    for name, cfg in (("fsdp", CFG), ("fsdp_tied", TIED), ("tp", CFG)):
        ref = export_hf(_model(cfg), cfg, tmp_path / f"ref_{name}", dtype=torch.float32)
        want = load_file(str(ref / "model.safetensors"))
        got = load_file(str(tmp_path / name / "model.safetensors"))
        assert set(got) == set(want)
        assert ("lm_head.weight" in got) == (not cfg.tie_embeddings)
        for k in want:
            assert torch.equal(got[k], want[k]), (name, k)
        assert (tmp_path / name / "config.json").read_text() == (ref / "config.json").read_text()
