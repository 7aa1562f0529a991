"""Is a training plan possible? Checked on the machine that submits, before a node is paid for (torch-free).

A plan is the arithmetic every tensor-parallel Llama trainer depends on: attention heads and KV heads against the
tensor-parallel degree (and NxD's KV replication), the global batch against data parallelism x micro-batch x
accumulation, the sequence against the model's positions, the world against nodes x processes and TP x CP, and the
attention options NxD's Llama refuses (context parallelism with flash attention, a fused QKV module on a model with
as many KV heads as heads). Each problem is
one line naming the setting and the fix; `check` raises them together as one ConfigError.

Two readers fill a plan: `nxd_llama_plan` from the command line of NeuronX Distributed's Llama scripts
(aws-neuron/neuronx-distributed, examples/training/llama/tp_zero1_llama_hf_pretrain.py, with its config.json),
and `stoker_train_plan` from the pipeline's config (`stoker.train`'s settings).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stoker.errors import ConfigError
from stoker.train.settings import get_model_config


@dataclass(kw_only=True)
class TrainPlan:
    """The numbers a plan is checked on. `names` maps each field to how the user spells it (for messages)."""

    heads: int
    kv_heads: int
    tp: int
    nodes: int
    nproc_per_node: int
    seq_len: int
    max_positions: int | None = None
    micro_batch: int = 1
    global_batch: int | None = None  # None: whatever dp x micro x accum gives
    grad_accum: int | None = None  # None: derived from the global batch
    kv_replicator: int = 1  # NxD: each KV head is repeated this many times before it is split over TP
    replicator_needs_qkv_linear: bool = False  # NxD without --qkv_linear: k/v are not replicated, so it must be 1
    cp: int = 1  # context parallelism: each data-parallel replica is tp x cp ranks
    flash_attention: bool = False  # NxD: context parallelism (ring attention) refuses flash attention
    fused_qkv_linear: bool = False  # NxD: --qkv_linear with --fuse_qkv 1 (see _nxd_problems)
    names: Mapping[str, str] | None = None

    def name(self, field: str) -> str:
        return (self.names or {}).get(field, field)

    @property
    def world(self) -> int:
        return self.nodes * self.nproc_per_node


def problems(p: TrainPlan) -> list[str]:
    """Every reason the plan cannot run, one line each (empty: it can)."""
    n = p.name
    out: list[str] = []
    if min(p.tp, p.cp, p.nodes, p.nproc_per_node, p.micro_batch, p.kv_replicator) < 1:
        return [f"{n('tp')}, {n('cp')}, nodes, processes per node, {n('micro_batch')} and {n('kv_replicator')} "
                f"must be at least 1 (got {p.tp}, {p.cp}, {p.nodes}, {p.nproc_per_node}, {p.micro_batch}, "
                f"{p.kv_replicator})"]
    model_parallel = p.tp * p.cp
    if p.world % model_parallel and p.cp == 1:
        out.append(f"{p.nodes} nodes x {p.nproc_per_node} processes = {p.world} ranks, not a multiple of "
                   f"{n('tp')}={p.tp}: pick a tensor-parallel degree that divides {p.world}")
    elif p.world % model_parallel:  # NxD's initialize_model_parallel raises it (parallel_state.py L572-579)
        out.append(f"{p.nodes} nodes x {p.nproc_per_node} processes = {p.world} ranks, not a multiple of "
                   f"{n('tp')}={p.tp} x {n('cp')}={p.cp} = {model_parallel}: pick degrees whose product "
                   f"divides {p.world}")
    out += _nxd_problems(p)
    if p.heads % p.tp:
        out.append(f"{n('heads')}={p.heads} is not divisible by {n('tp')}={p.tp}: use a {n('tp')} that divides "
                   f"{p.heads}")
    if p.kv_replicator > 1 and p.replicator_needs_qkv_linear:
        out.append(f"{n('kv_replicator')}={p.kv_replicator} without --qkv_linear: the script's k/v projections "
                   f"are not replicated, so attention views {p.kv_heads} KV heads as {p.kv_heads * p.kv_replicator}: "
                   f"add --qkv_linear or set {n('kv_replicator')} to 1")
    elif p.kv_replicator > 1 and p.tp % p.kv_replicator:  # NxD's GQAQKVColumnParallelLinear asserts it
        out.append(f"{n('tp')}={p.tp} is not a multiple of {n('kv_replicator')}={p.kv_replicator} (NxD's "
                   f"GQAQKVColumnParallelLinear asserts it): set {n('kv_replicator')} to {_fix_replicator(p)}")
    # NxD's modeling_llama_nxd (LlamaAttention): heads per rank = divide(num_attention_heads, tp), KV heads per rank
    # = divide(num_key_value_heads * kv_replicator, tp), num_key_value_groups = their quotient
    kv = p.kv_heads * p.kv_replicator
    if kv % p.tp:
        out.append(f"{n('kv_heads')}={p.kv_heads} x {n('kv_replicator')}={p.kv_replicator} = {kv} KV heads is not "
                   f"divisible by {n('tp')}={p.tp}: set {n('kv_replicator')} to {_fix_replicator(p)}")
    elif p.heads % p.tp == 0:
        q_rank, kv_rank = p.heads // p.tp, kv // p.tp
        if kv_rank > q_rank or q_rank % kv_rank:
            out.append(f"{n('kv_heads')}={p.kv_heads} x {n('kv_replicator')}={p.kv_replicator} over {n('tp')}="
                       f"{p.tp} gives {kv_rank} KV heads per rank for {q_rank} query heads, so "
                       f"num_key_value_groups = {q_rank // kv_rank} and attention fails on its shapes: set "
                       f"{n('kv_replicator')} to {_fix_replicator(p)}")
    if p.max_positions is not None and p.seq_len > p.max_positions:
        out.append(f"{n('seq_len')}={p.seq_len} is longer than the model's {p.max_positions} positions "
                   f"({n('max_positions')}): shorten the sequence or raise {n('max_positions')}")
    if p.world % model_parallel == 0:
        dp = p.world // model_parallel
        if p.global_batch is not None:
            per_step = dp * p.micro_batch
            if p.global_batch % per_step:
                out.append(f"{n('global_batch')}={p.global_batch} is not a multiple of data parallel {dp} x "
                           f"{n('micro_batch')}={p.micro_batch} = {per_step}: use a multiple of {per_step} "
                           f"(e.g. {max(per_step, p.global_batch // per_step * per_step)})")
            elif p.grad_accum is not None and p.grad_accum * per_step != p.global_batch:
                out.append(f"{n('grad_accum')}={p.grad_accum} x {per_step} sequences per step = "
                           f"{p.grad_accum * per_step}, not {n('global_batch')}={p.global_batch}: set "
                           f"{n('grad_accum')}={p.global_batch // per_step}")
    return out


def _nxd_problems(p: TrainPlan) -> list[str]:
    """What NxD's LlamaAttention refuses whatever the arithmetic (aws-neuron/neuronx-distributed@fbac349,
    examples/training/llama/modeling_llama_nxd.py)."""
    n, out = p.name, []
    if p.cp > 1 and p.flash_attention:  # L288-291: ring attention (CP > 1) with flash attention is a ValueError
        out.append(f"{n('cp')}={p.cp} with flash attention ({n('flash_attention')} is 1 unless given): NxD's "
                   f"attention raises \"Context parallelism is not supported with flash attention\": add "
                   f"{n('flash_attention')} 0, or set {n('cp')} to 1")
    # L300-311 build GQAQKVColumnParallelLinear(fuse_qkv=...) under --qkv_linear; forward (L404-410) then takes the
    # fused branch when fuse_qkv and heads == KV heads and kv_replicator == 1, and calls .split on the tuple that
    # module returns: the first forward fails
    if p.fused_qkv_linear and p.heads == p.kv_heads and p.kv_replicator == 1:
        out.append(f"--qkv_linear with {n('fuse_qkv')} 1 (NxD's default) on a model with as many KV heads as heads "
                   f"({n('kv_heads')}={p.kv_heads}) and {n('kv_replicator')} 1: NxD's attention calls .split on "
                   f"the tuple its QKV module returns and fails on its first forward: add {n('fuse_qkv')} 0, or "
                   f"drop --qkv_linear")
    return out


def _fix_replicator(p: TrainPlan) -> str:
    """The KV replications that work at this TP (NxD's rule: (kv x r) % tp == 0 and query heads per rank a
    multiple of KV heads per rank), smallest first."""
    ok = [r for r in range(1, p.tp + 1) if (p.kv_heads * r) % p.tp == 0 and p.heads % p.tp == 0
          and (p.heads // p.tp) % max(1, p.kv_heads * r // p.tp) == 0 and p.kv_heads * r // p.tp >= 1]
    return " or ".join(str(r) for r in ok[:3]) if ok else "a value that works (none does at this TP)"


def check(p: TrainPlan, where: str) -> None:
    """Raise one ConfigError listing every problem of the plan, each on its own line."""
    found = problems(p)
    if found:
        raise ConfigError(f"{where}: this training cannot run as configured:\n  - " + "\n  - ".join(found))


# --- NeuronX Distributed's Llama scripts --------------------------------------------------------------------
NXD_NAMES = {"heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "tp": "--tensor_parallel_size",
             "cp": "--context_parallel_size", "kv_replicator": "--kv_replicator", "seq_len": "--seq_len",
             "micro_batch": "--batch_size", "grad_accum": "--grad_accum_usteps", "global_batch": "global batch",
             "flash_attention": "--use_flash_attention", "fuse_qkv": "--fuse_qkv"}
# The defaults of the flags a plan reads: tp_zero1_llama_hf_pretrain.py's argparse (@fbac349, L528-673)
NXD_DEFAULTS = {"tensor_parallel_size": 2, "context_parallel_size": 1, "seq_len": 2048, "batch_size": 8,
                "grad_accum_usteps": 64, "kv_replicator": 1, "qkv_linear": False, "use_flash_attention": 1,
                "fuse_qkv": 1}


def _flag(args: Mapping[str, Any], name: str, default: Any = None) -> Any:
    for key in (name, f"--{name}"):
        if key in args and args[key] is not None:
            return args[key]
    return default


def nxd_llama_plan(args: Mapping[str, Any], model_config: Mapping[str, Any] | str | os.PathLike, *, nodes: int,
                   nproc_per_node: int, global_batch: int | None = None) -> TrainPlan:
    """The plan of NxD's tp_zero1_llama_hf_pretrain.py run with `args` (its flags as a dict, without `--`) and
    `model_config` (its config.json, or the path of it)."""
    if not isinstance(model_config, Mapping):
        try:
            with open(model_config) as f:
                model_config = json.load(f)
        except (OSError, ValueError) as e:
            raise ConfigError(f"the model config {model_config} cannot be read ({e}): copy config.json from NxD's "
                              f"examples/training/llama (tp_zero1_llama_hf_pretrain/7B_config_llama2/) next to "
                              f"the flow") from None
    heads = int(model_config["num_attention_heads"])

    def flag(name: str) -> Any:
        return _flag(args, name, NXD_DEFAULTS[name])

    qkv_linear = bool(flag("qkv_linear"))
    return TrainPlan(
        heads=heads, kv_heads=int(model_config.get("num_key_value_heads") or heads),
        tp=int(flag("tensor_parallel_size")), cp=int(flag("context_parallel_size")), nodes=nodes,
        nproc_per_node=nproc_per_node,
        # no max_positions: the script raises config.max_position_embeddings to --seq_len itself (its 7B config
        # says 2048 and the 7B script trains at 4096)
        seq_len=int(flag("seq_len")), micro_batch=int(flag("batch_size")),
        grad_accum=int(flag("grad_accum_usteps")), global_batch=global_batch,
        kv_replicator=int(flag("kv_replicator")), replicator_needs_qkv_linear=not qkv_linear,
        # the script reads both as `args.X > 0` (L141, L143)
        flash_attention=int(flag("use_flash_attention")) > 0,
        fused_qkv_linear=qkv_linear and int(flag("fuse_qkv")) > 0, names=NXD_NAMES)


# --- stoker.train ----------------------------------------------------------------------------------------------
STOKER_NAMES = {"heads": "model.n_heads", "kv_heads": "model.n_kv_heads", "tp": "parallel.tp",
                "seq_len": "data.block_size - 1", "max_positions": "model.max_seq_len",
                "micro_batch": "train.micro_batch_size", "global_batch": "train.global_batch_size",
                "kv_replicator": "kv replication"}


SHAPE_KEYS = ("n_heads", "n_kv_heads", "max_seq_len")


def model_shape(model: Mapping[str, Any]) -> dict[str, Any] | None:
    """n_heads, n_kv_heads and max_seq_len of a [model] section: its named shape (stoker.train.settings, no torch
    needed) with the section's own values over it; None when the shape is not known before training (a model
    taken from `init_from` without a name). An unknown name is a ConfigError listing the named shapes."""
    given = {k: model[k] for k in SHAPE_KEYS if k in model}
    name = model.get("name")
    if name and len(given) < len(SHAPE_KEYS):
        base = get_model_config(str(name)).to_dict()
        given = {**{k: base[k] for k in SHAPE_KEYS}, **given}
    return given if "n_heads" in given and "max_seq_len" in given else None


def stoker_train_plan(cfg: Mapping[str, Any], shape: Mapping[str, Any] | None = None) -> TrainPlan | None:
    """The plan of the pipeline config `cfg` ([data], [cluster], [train], [parallel]) for a model of `shape`
    (n_heads, n_kv_heads, max_seq_len; default: :func:`model_shape` of `cfg`'s [model]). None when the shape is
    not known before training."""
    shape = model_shape(cfg.get("model") or {}) if shape is None else shape
    if shape is None:
        return None
    train, par, cluster, data = (cfg.get(k) or {} for k in ("train", "parallel", "cluster", "data"))
    gbs = int(train.get("global_batch_size") or 0)
    return TrainPlan(heads=int(shape["n_heads"]), kv_heads=int(shape.get("n_kv_heads") or shape["n_heads"]),
                     tp=int(par.get("tp") or 1), nodes=int(cluster.get("nodes") or 1),
                     nproc_per_node=int(cluster.get("nproc_per_node") or 1),
                     seq_len=int(data.get("block_size") or 2) - 1, max_positions=int(shape["max_seq_len"]),
                     micro_batch=int(train.get("micro_batch_size") or 1), global_batch=gbs or None,
                     names=STOKER_NAMES)
