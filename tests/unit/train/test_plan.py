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


# --- issue 34, items 1-3: NxD's own source is the oracle (aws-neuron/neuronx-distributed@fbac349, "Release 2.29",
# examples/training/llama/tp_zero1_llama_hf_pretrain/tp_zero1_llama_hf_pretrain.py = "the script" and
# examples/training/llama/modeling_llama_nxd.py = "the model")

def _standin_parser():
    """The real script's argparse as tests/nxd_standin rebuilds it (names, types, defaults of L528-673)."""
    import sys
    from pathlib import Path

    standin = str(Path(__file__).resolve().parents[2] / "nxd_standin")
    sys.path.insert(0, standin)
    try:
        from tp_zero1_llama_hf_pretrain import build_parser
    finally:
        sys.path.remove(standin)
    return build_parser()


def test_the_plan_assumes_nxds_own_defaults():
    """The script: --tensor_parallel_size default=2 (L587, not 8), --context_parallel_size default=1 (L588),
    --use_flash_attention default=1 (L661-666), --fuse_qkv default=1 (L667)."""
    from stoker.train.plan import NXD_DEFAULTS

    parser = _standin_parser()
    for flag, default in NXD_DEFAULTS.items():
        assert parser.get_default(flag) == default, flag
    bare = nxd_llama_plan({}, LLAMA2_7B, nodes=1, nproc_per_node=2)
    assert (bare.tp, bare.cp, bare.seq_len, bare.micro_batch, bare.grad_accum) == (2, 1, 2048, 8, 64)
    # 3 ranks: NxD at its default TP=2 refuses them (3 % 2); a TP of 8 assumed would have said the same for the
    # wrong reason, and passed 16 ranks with 32 heads where NxD's default TP=2 also fits: the number must be NxD's
    assert any("--tensor_parallel_size=2" in f for f in problems(nxd_llama_plan({}, LLAMA2_7B, nodes=1,
                                                                                nproc_per_node=3)))
    assert problems(nxd_llama_plan({}, LLAMA2_7B, nodes=1, nproc_per_node=2)) == []  # 2 ranks at TP 2: fine


def test_qkv_linear_with_fused_qkv_on_equal_kv_heads_is_refused_and_fuse_qkv_0_accepted():
    """The model: under --qkv_linear, LlamaAttention builds GQAQKVColumnParallelLinear(fuse_qkv=config.fuse_qkv)
    (L300-311); forward takes `if fuse_qkv and num_heads == num_key_value_heads and kv_shared_group_size == 1` first
    and calls qkv_states.split(...) (L404-410) on the tuple that module returns: the first forward fails. The script
    sets config.fuse_qkv = args.fuse_qkv > 0 (L143) from --fuse_qkv default=1 (L667)."""
    args = {**NXD_7B, "qkv_linear": True, "kv_replicator": 1}
    with pytest.raises(ConfigError) as e:
        check(nxd_llama_plan(args, LLAMA2_7B, nodes=4, nproc_per_node=32, global_batch=1024), "step train")
    lines = [ln for ln in str(e.value).splitlines() if "fuse_qkv" in ln]
    assert len(lines) == 1 and "add --fuse_qkv 0" in lines[0] and ".split" in lines[0], str(e.value)
    assert problems(nxd_llama_plan({**args, "fuse_qkv": 0}, LLAMA2_7B, nodes=4, nproc_per_node=32,
                                   global_batch=1024)) == []
    # fewer KV heads than heads (Llama-3-8B's script: --qkv_linear --kv_replicator 4, fuse_qkv left at 1): the
    # fused branch is not taken (num_heads != num_key_value_heads), so it runs
    llama3 = {**NXD_7B, "tensor_parallel_size": 32, "qkv_linear": True, "kv_replicator": 4}
    assert problems(nxd_llama_plan(llama3, LLAMA3_8B, nodes=4, nproc_per_node=32)) == []
    # without --qkv_linear, fuse_qkv builds one ColumnParallelLinear whose output is a tensor (L312-323): fine
    assert problems(nxd_llama_plan(NXD_7B, LLAMA2_7B, nodes=4, nproc_per_node=32, global_batch=1024)) == []


def test_context_parallelism_is_checked():
    """The model: context parallel size > 1 turns ring attention on, and ring attention with flash attention
    (--use_flash_attention default=1, the script L661-666, read as `> 0` at L141) raises ValueError (L288-291).
    neuronx_distributed/parallel_layers/parallel_state.py L572-579: world_size not divisible by tp x pp x cp raises
    RuntimeError; data parallel = world_size // (tp x pp x cp) (L580)."""
    cp2 = {**NXD_7B, "context_parallel_size": 2}
    found = problems(nxd_llama_plan(cp2, LLAMA2_7B, nodes=4, nproc_per_node=32))
    assert any("--context_parallel_size=2 with flash attention" in f and "--use_flash_attention 0" in f
               for f in found), found
    ok = {**cp2, "use_flash_attention": 0}
    assert problems(nxd_llama_plan(ok, LLAMA2_7B, nodes=4, nproc_per_node=32)) == []
    # 24 ranks: a multiple of TP 8, not of TP 8 x CP 2
    found = problems(nxd_llama_plan(ok, LLAMA2_7B, nodes=3, nproc_per_node=8))
    assert any("24 ranks, not a multiple of --tensor_parallel_size=8 x --context_parallel_size=2" in f
               for f in found), found
    # the global batch counts data parallelism without the CP ranks: 128 / (8 x 2) = DP 8; 8 x 1 x 64 = 512
    assert problems(nxd_llama_plan(ok, LLAMA2_7B, nodes=4, nproc_per_node=32, global_batch=512)) == []
    found = problems(nxd_llama_plan(ok, LLAMA2_7B, nodes=4, nproc_per_node=32, global_batch=1024))
    assert any("set --grad_accum_usteps=128" in f for f in found), found


def test_the_plan_agrees_with_the_standins_reading_of_nxd():
    """Over a grid of heads, TP, KV replication, --qkv_linear, --fuse_qkv, CP and flash attention, the plan refuses
    exactly what tests/nxd_standin's head_arithmetic (NxD's LlamaAttention rules, cited there line by line) does."""
    import itertools
    import sys
    from pathlib import Path

    standin = str(Path(__file__).resolve().parents[2] / "nxd_standin")
    sys.path.insert(0, standin)
    try:
        from tp_zero1_llama_hf_pretrain import head_arithmetic
    finally:
        sys.path.remove(standin)
    disagree = []
    for model, tp, rep, qkv, fuse, cp, flash in itertools.product(
            (LLAMA2_7B, {**LLAMA3_8B, "hidden_size": 4096}), (1, 2, 4, 8, 16, 32), (1, 2, 4, 8), (False, True),
            (0, 1), (1, 2), (0, 1)):
        args = {"tensor_parallel_size": tp, "kv_replicator": rep, "qkv_linear": qkv, "fuse_qkv": fuse,
                "context_parallel_size": cp, "use_flash_attention": flash}
        ours = problems(nxd_llama_plan(args, model, nodes=1, nproc_per_node=64))
        theirs, _ = head_arithmetic(model, tp, rep, qkv, cp=cp, use_flash_attention=flash, fuse_qkv=fuse)
        if bool(ours) != bool(theirs):
            disagree.append((model["num_key_value_heads"], args, ours, theirs))
    assert not disagree, disagree[:3]
