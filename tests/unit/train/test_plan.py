"""Training plans refused before submitting (stoker.train.plan): NxD's Llama flags and stoker's pipeline config."""

from __future__ import annotations

import pytest

from stoker.errors import ConfigError
from stoker.train.plan import TrainPlan, check, nxd_llama_plan, problems, stoker_train_plan

LLAMA2_7B = {"num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 4096,
             "hidden_size": 4096, "num_hidden_layers": 32, "vocab_size": 32000}
LLAMA3_8B = {"num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 8192}
NXD_7B = {"tensor_parallel_size": 8, "batch_size": 1, "grad_accum_usteps": 64, "seq_len": 4096}


def test_nxd_llama2_7b_as_its_own_script_passes():
    plan = nxd_llama_plan(NXD_7B, LLAMA2_7B, nodes=4, nproc_per_node=32, global_batch=1024)
    assert problems(plan) == []  # 128 ranks / TP 8 = DP 16; 16 x 1 x 64 = 1024


def test_llama3_flags_on_llama2_are_refused_before_submitting():
    """qkv_linear + kv_replicator=4 come from NxD's Llama-3-8B script: 32 x 4 KV heads over TP 8 are 16 per rank
    for 4 query heads, so num_key_value_groups = 0."""
    args = {**NXD_7B, "qkv_linear": True, "kv_replicator": 4}
    with pytest.raises(ConfigError) as e:
        check(nxd_llama_plan(args, LLAMA2_7B, nodes=4, nproc_per_node=32, global_batch=1024), "step train")
    msg = str(e.value)
    assert "num_key_value_groups = 0" in msg and "--kv_replicator to 1" in msg
    # ... and right for Llama-3-8B (8 KV heads x 4 = 32 over TP 32 is 1 per rank)
    ok = nxd_llama_plan({**args, "tensor_parallel_size": 32}, LLAMA3_8B, nodes=4, nproc_per_node=32)
    assert problems(ok) == []
    # without --qkv_linear the k/v projections are not replicated: the forward pass's view fails
    found = problems(nxd_llama_plan({**NXD_7B, "kv_replicator": 4}, LLAMA2_7B, nodes=4, nproc_per_node=32))
    assert any("without --qkv_linear" in f for f in found), found


@pytest.mark.parametrize("change, words", [
    ({"grad_accum_usteps": 32}, "set --grad_accum_usteps=64"),
    ({"tensor_parallel_size": 6}, "num_attention_heads=32 is not divisible by --tensor_parallel_size=6"),
])
def test_each_problem_is_one_line_naming_the_fix(change, words):
    found = problems(nxd_llama_plan({**NXD_7B, **change}, LLAMA2_7B, nodes=4, nproc_per_node=32, global_batch=1024))
    assert any(words in line for line in found), found


def test_batch_and_ranks():
    p = TrainPlan(heads=32, kv_heads=8, tp=8, nodes=3, nproc_per_node=4, seq_len=128, global_batch=100)
    found = problems(p)
    assert any("12 ranks, not a multiple of tp=8" in f for f in found), found
    p = TrainPlan(heads=32, kv_heads=8, tp=8, nodes=4, nproc_per_node=32, seq_len=128, global_batch=1000,
                  micro_batch=1)
    assert any("global_batch=1000 is not a multiple of data parallel 16" in f for f in problems(p))


def test_stoker_pipeline_plan():
    cfg = {"data": {"block_size": 4097}, "cluster": {"nodes": 4, "nproc_per_node": 32},
           "train": {"micro_batch_size": 1, "global_batch_size": 1024}, "parallel": {"tp": 8}}
    shape = {"n_heads": 32, "n_kv_heads": 32, "max_seq_len": 4096}
    assert problems(stoker_train_plan(cfg, shape)) == []
    bad = {**cfg, "data": {"block_size": 8193}, "parallel": {"tp": 64}}
    found = problems(stoker_train_plan(bad, shape))
    assert any("data.block_size - 1=8192 is longer" in f for f in found)
    assert any("model.n_heads=32 is not divisible by parallel.tp=64" in f for f in found)


def test_the_pipeline_refuses_a_bad_plan_when_the_run_starts():
    from stoker.recipes.llama_pretrain import check_train_plan

    with pytest.raises(ConfigError, match="parallel.tp=3"):
        check_train_plan({"model": {"name": "tiny"}, "parallel": {"tp": 3}, "cluster": {"nodes": 1,
                                                                                         "nproc_per_node": 3},
                          "data": {"block_size": 65}})
    check_train_plan({"model": {"name": "llama2-7b"}, "parallel": {"tp": 8}, "data": {"block_size": 4097},
                      "cluster": {"nodes": 4, "nproc_per_node": 32},
                      "train": {"micro_batch_size": 1, "global_batch_size": 1024}})
