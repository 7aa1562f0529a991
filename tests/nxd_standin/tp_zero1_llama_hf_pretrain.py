"""A test-only stand-in for NeuronX Distributed's Llama pretraining script, written from its documented command line.

Source (read, not copied): aws-neuron/neuronx-distributed at commit fbac349b61a3adbb123c2983835af692840ff62f
("Release 2.29"):
  examples/training/llama/tp_zero1_llama_hf_pretrain/tp_zero1_llama_hf_pretrain.py   argparse, data, checkpoints
  examples/training/llama/tp_zero1_llama_hf_pretrain/tp_zero1_llama2_7B_hf_pretrain.sh the 7B flags and env
  examples/training/llama/modeling_llama_nxd.py                                      LlamaAttention head arithmetic
  src/neuronx_distributed/modules/qkv_linear.py                                      GQAQKVColumnParallelLinear asserts
  src/neuronx_distributed/trainer/checkpoint.py, checkpoint_storage.py               checkpoint layout, s3://

Used because neuronx-distributed (torch-neuronx, torch_xla, Neuron devices) cannot be installed here. It runs on a
CPU with no torch: it takes exactly the real script's flags (an unknown flag is an error, as `parse_args` makes it),
checks what the real script and its environment need, and fails with a clear message and a non-zero exit where the
real one would fail (or, for the environment, where a multi-node Trainium run would). Then it "trains" trivially,
prints NxD-like log lines, and writes/loads checkpoints laid out as `nxd.save_checkpoint` lays them out (local
folder or s3://, through boto3, which honours AWS_ENDPOINT_URL). Only global rank 0 writes.

Deliberately faithful, where a user might expect otherwise:
- no checkpoint is written at the end of training: the real script saves only when global_step % checkpoint_freq
  == 0 (tp_zero1_llama_hf_pretrain.py L338);
- `--steps_this_run` and `--max_steps` have no default; the real script compares `args.steps_this_run < 0` (L679),
  a TypeError when either is absent;
- `steps_this_run` is an absolute global step: a resumed run stops when global_step >= steps_this_run, after at
  least one step (the loop checks after stepping, L354).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import socket
import sys
import time
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
# `from logger import Logger`, `from modeling_llama_nxd import ...`, `from training_utils import ...` (L34-36):
# top-level imports, so these files must sit next to the script (sys.path[0]). AdamW_FP32OptimParams comes from
# the installed package (neuronx_distributed.utils.adamw_fp32_optim_params, L43), not from a local file.
LOCAL_MODULES = ("logger", "modeling_llama_nxd", "training_utils")
AWSVPC_BRIDGE_IFACE = "ecs-eth0"  # the ECS agent's link-local veth in an awsvpc task (169.254.172.0/22)
COLUMNS = ("input_ids", "attention_mask", "labels")  # train_loop_fn reads these three (L280-282)


class Refused(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    """The real script's argparse (L528-673), same names, types, defaults and actions."""
    p = argparse.ArgumentParser()
    p.add_argument("--model_path", type=str, help="Model weight and config path.")
    p.add_argument("--data_dir", type=str, help="Pre-tokenized dataset directory.")
    p.add_argument("--output_dir", type=str, default="./output", help="Directory for checkpoints and logs.")
    p.add_argument("--metrics_file", type=str, default="results.json", help="training metrics results file")
    p.add_argument("--batch_size", type=int, default=8, help="Worker batch size.")
    p.add_argument("--max_steps", type=int, help="Maximum total accumulation-steps to run.")
    p.add_argument("--steps_this_run", type=int,
                   help="Exit early at <value> steps and not go to max_steps. -1 to mean no early exit.")
    p.add_argument("--seed", type=int, default=12349, help="Random seed. Worker seed is this value + worker rank.")
    p.add_argument("--lr", type=float, default=4e-4, help="Learning rate.")
    p.add_argument("--warmup_steps", type=int, default=2000,
                   help="Number of warmup accumulation-steps for learning rate .")
    p.add_argument("--grad_accum_usteps", type=int, default=64,
                   help="Gradient accumulation micro-steps (an accumulation-step has <value> micro-steps.")
    p.add_argument("--print_grad_norm", default=False, action="store_true", help="Whether to print grad norm")
    p.add_argument("--tensor_parallel_size", default=2, type=int, help="Tensor parallel size")
    p.add_argument("--context_parallel_size", type=int, default=1, help="CP size")
    p.add_argument("--seq_len", default=2048, type=int, help="Sequence length")
    p.add_argument("--use_mix_precision", action="store_true", help="Use mix precision.")
    p.add_argument("--use_zero_1", action="store_true", help="Use ZeRO-1.")
    p.add_argument("--num_layers", type=int, default=-1, help="Override number of layers for this LLaMA model")
    p.add_argument("--sequence_parallel_enabled", default=False, action="store_true", help="Enable sequence parallel")
    p.add_argument("--selective_checkpoint_enabled", default=False, action="store_true",
                   help="Enable selective checkpoint")
    p.add_argument("--use_meta_device_init", default=False, action="store_true",
                   help="use meta device initialization")
    p.add_argument("--logging_interval", default=1, type=int, help="logging every N steps")
    p.add_argument("--qkv_linear", default=False, action="store_true", help="Whether to use the QKV Module")
    p.add_argument("--kv_replicator", default=1, type=int, help="KV replication number")
    p.add_argument("--use_gpu_compatible_precision", default=1, type=int, help="Use gpu compatible precision")
    p.add_argument("--weight_decay", default=0.01, type=float, help="weight decay")
    p.add_argument("--beta1", default=0.9, type=float, help="beta1 parameter for Adam optimizer")
    p.add_argument("--beta2", default=0.999, type=float, help="beta2 parameter for Adam optimizer")
    p.add_argument("--checkpoint_freq", type=int, default=100000, help="save checkpoint freq")
    p.add_argument("--checkpoint_dir", type=str, default=None)
    p.add_argument("--pretrained_weight", default=False, action="store_true")
    p.add_argument("--loading_step", type=str, default="-1",
                   help='resume from checkpoint generated by the step, "-1" means no load, '
                        '"latest_if_exists" is a valid option to resume from latest')
    p.add_argument("--num_kept_checkpoint", type=int, default=-1,
                   help="number of checkpoints kept, old checkpoint will get deleted")
    p.add_argument("--hidden_size", type=int, default=-1, help="override model hidden size")
    p.add_argument("--use_flash_attention", default=1, type=int, help="Use neuron kernel")
    p.add_argument("--fuse_qkv", type=int, default=1, help="Whether to enable fused qkv")
    p.add_argument("--transpose_nki_inputs", type=int, default=1,
                   help="Whether to transpose inputs to nki kernel for better perf when using FlashAttention")
    return p


# ---------------------------------------------------------------------------------------------- the checks


def check_steps(args) -> list[str]:
    problems = []
    if args.steps_this_run is None:
        problems.append("--steps_this_run is missing: the real script does `args.steps_this_run < 0` (TypeError)")
    if args.max_steps is None:
        problems.append("--max_steps is missing: the LR schedule and the -1 early-exit rule need it")
    return problems


def check_local_modules() -> list[str]:
    missing = [m + ".py" for m in LOCAL_MODULES if not os.path.exists(os.path.join(HERE, m + ".py"))]
    if missing:
        return [f"{', '.join(missing)} not next to {os.path.basename(__file__)} in {HERE}: the real script imports "
                f"them as top-level modules (copy them from neuronx-distributed examples/training/llama/)"]
    return []


def check_env(args) -> tuple[list[str], dict]:
    problems, dist = [], {}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        val = os.environ.get(var)
        if val is None or not val.strip().lstrip("-").isdigit():
            problems.append(f"{var} is {'unset' if val is None else repr(val)}: run under torchrun, which sets "
                            f"RANK, WORLD_SIZE and LOCAL_RANK")
        else:
            dist[var] = int(val)
    ws, tp, cp = dist.get("WORLD_SIZE"), args.tensor_parallel_size, args.context_parallel_size
    if ws is not None and tp > 0 and cp > 0 and ws % (tp * cp):
        problems.append(f"WORLD_SIZE={ws} is not divisible by tensor_parallel_size={tp} x context_parallel_size={cp}")

    ifname = os.environ.get("CCOM_SOCKET_IFNAME")
    listed = os.environ.get("BATCH_EMULATOR_INTERFACES")
    if listed is not None:
        ifaces, source = [i.strip() for i in listed.split(",") if i.strip()], "BATCH_EMULATOR_INTERFACES"
    else:
        ifaces, source = [name for _, name in socket.if_nameindex()], "socket.if_nameindex()"
    if not ifname:
        problems.append("CCOM_SOCKET_IFNAME is not set: the Neuron collectives' bootstrap socket needs the node's "
                        "VPC interface (the AWS Batch recipe and NxD's multi-node scripts set eth0)")
    elif ifname == AWSVPC_BRIDGE_IFACE:
        problems.append(f"CCOM_SOCKET_IFNAME={ifname} names the awsvpc task's link-local bridge to the ECS agent "
                        f"(169.254.172.0/22), which other nodes cannot reach; use the task ENI (eth0)")
    elif ifname not in ifaces:
        problems.append(f"CCOM_SOCKET_IFNAME={ifname} is not an interface of this node ({source}: "
                        f"{', '.join(ifaces) or 'none'})")

    cc = os.environ.get("NEURON_CC_FLAGS")
    words = (cc or "").replace("=", " ").split()
    if cc is None:
        problems.append("NEURON_CC_FLAGS is not set: NxD's 7B script exports "
                        "NEURON_CC_FLAGS=\"--model-type transformer --cache_dir=...\"")
    elif not any(words[i:i + 2] == ["--model-type", "transformer"] for i in range(len(words))):
        problems.append(f"NEURON_CC_FLAGS={cc!r} lacks --model-type transformer (NxD's 7B script sets it)")
    elif "--distribution-strategy" in words:
        i = words.index("--distribution-strategy")
        if words[i + 1:i + 2] != ["llm-training"]:
            problems.append(f"NEURON_CC_FLAGS={cc!r}: the distribution strategy for training is llm-training")
    return problems, dist


def load_config(args) -> tuple[list[str], dict | None]:
    """`LlamaConfig.from_pretrained(model_path)` (L136): a folder holding config.json, or a json file's path."""
    if not args.model_path:
        return ["--model_path is missing: LlamaConfig.from_pretrained needs the folder of config.json"], None
    path = os.path.expanduser(args.model_path)
    cfg_file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    if not os.path.isfile(cfg_file):
        return [f"model config {cfg_file} not found (--model_path {args.model_path})"], None
    try:
        with open(cfg_file) as f:
            return [], json.load(f)
    except (OSError, ValueError) as e:
        return [f"model config {cfg_file} is not readable JSON: {e}"], None


def head_arithmetic(cfg: dict, tp: int, kv_replicator: int, qkv_linear: bool, hidden_size: int = -1,
                    cp: int = 1, use_flash_attention: int = 1, seq_len: int | None = None,
                    sequence_parallel: bool = False, fuse_qkv: int = 1) -> tuple[list[str], dict]:
    """What LlamaAttention.__init__/forward accept (modeling_llama_nxd.py L251-365, L438-447 @fbac349):

      head_dim            = hidden_size // num_attention_heads;  head_dim * heads == hidden_size (L294)
      heads per rank      = divide(num_attention_heads, tp)                                         (L361)
      kv heads per rank   = divide(num_key_value_heads * kv_replicator, tp)                          (L362)
      num_key_value_groups = heads per rank // kv heads per rank; repeat_kv(k, groups) (L365, L438): a
                            group of 0 leaves no key heads, a remainder leaves q and k head counts unequal
      qkv_linear: GQAQKVColumnParallelLinear asserts tp % kv_size_multiplier == 0 and
                  (kv_heads * head_dim * kv_size_multiplier) % tp == 0      (qkv_linear.py L444-447)
      without qkv_linear, k_proj/v_proj give kv_heads/tp heads per rank while forward views
                  kv_heads*kv_replicator/tp: kv_replicator must be 1
      context parallel with flash attention is a ValueError (L288-291); sequence parallel splits the
                  sequence over the tp ranks (mappings._split_along_first_dim -> divide).
      qkv_linear with fuse_qkv (the script's default 1, L667, set as config.fuse_qkv = args.fuse_qkv > 0, L143):
                  when heads == kv heads and kv_replicator == 1 forward takes the fused branch (L404-410) and
                  calls .split on the tuple GQAQKVColumnParallelLinear returns: the first forward fails.
    """
    problems = []
    heads = int(cfg.get("num_attention_heads", 0))
    kv = int(cfg.get("num_key_value_heads", heads) or heads)
    hidden = hidden_size if hidden_size != -1 else int(cfg.get("hidden_size", 0))
    facts = {"heads": heads, "kv_heads": kv, "hidden_size": hidden, "tp": tp, "kv_replicator": kv_replicator}
    if tp < 1 or kv_replicator < 1 or heads < 1:
        return [f"tensor_parallel_size={tp}, kv_replicator={kv_replicator}, num_attention_heads={heads}: "
                f"each must be at least 1"], facts
    head_dim = hidden // heads
    facts["head_dim"] = head_dim
    if head_dim * heads != hidden:
        problems.append(f"hidden_size {hidden} is not divisible by num_attention_heads {heads}")
    if heads % tp:
        problems.append(f"num_attention_heads {heads} is not divisible by tensor_parallel_size {tp}")
    if (kv * kv_replicator) % tp:
        problems.append(f"num_key_value_heads {kv} x kv_replicator {kv_replicator} = {kv * kv_replicator} is not "
                        f"divisible by tensor_parallel_size {tp}")
    if qkv_linear:
        if tp % kv_replicator:
            problems.append(f"tensor_parallel_size {tp} is not divisible by kv_replicator {kv_replicator} "
                            f"(GQAQKVColumnParallelLinear's assert)")
    elif kv_replicator != 1:
        problems.append(f"kv_replicator {kv_replicator} without --qkv_linear: k/v projections give "
                        f"{kv}/{tp} heads per rank but attention expects {kv}x{kv_replicator}/{tp}")
    if not problems:
        q_rank, kv_rank = heads // tp, kv * kv_replicator // tp
        facts.update(q_heads_per_rank=q_rank, kv_heads_per_rank=kv_rank, kv_groups=q_rank // kv_rank)
        if kv_rank > q_rank or q_rank % kv_rank:
            problems.append(f"at tensor_parallel_size {tp} with kv_replicator {kv_replicator}, each rank holds "
                            f"{q_rank} query heads and {kv}x{kv_replicator}/{tp} = {kv_rank} key/value heads: "
                            f"num_key_value_groups = {q_rank}//{kv_rank} = {q_rank // kv_rank}, so attention "
                            f"fails (replicate KV heads only up to tp; kv_replicator must divide "
                            f"{heads}/{kv} and make kv heads per rank >= 1)")
    if cp > 1 and use_flash_attention:
        problems.append("context_parallel_size > 1 needs --use_flash_attention 0 (ring attention only)")
    if qkv_linear and fuse_qkv > 0 and heads == kv and kv_replicator == 1:
        problems.append("AttributeError: 'tuple' object has no attribute 'split' (--qkv_linear with --fuse_qkv 1 "
                        "and as many KV heads as heads: the fused branch of LlamaAttention.forward)")
    if sequence_parallel and seq_len is not None and seq_len % tp:
        problems.append(f"seq_len {seq_len} is not divisible by tensor_parallel_size {tp} (sequence parallel)")
    return problems, facts


def check_data(args, dp_size: int | None) -> tuple[list[str], int]:
    data_dir = args.data_dir
    if not data_dir:
        return ["--data_dir is missing"], 0
    if not os.path.exists(os.path.expanduser(data_dir)):  # the real assert (L415), after model init
        hint = (" (the real script asserts os.path.exists: an s3:// prefix must be downloaded to a local folder "
                "first)" if "://" in data_dir else "")
        return [f"ERROR: Data directory {data_dir} doesn't exist!{hint}"], 0
    try:
        import datasets
    except ImportError:
        return ["the datasets package is not installed (NxD's requirements.txt: datasets<=3.6.0)"], 0
    try:
        ds = datasets.load_from_disk(os.path.expanduser(data_dir))  # training_utils.create_llama_pretraining_dataset
    except Exception as e:  # noqa: BLE001 - any failure of load_from_disk is the message
        return [f"datasets.load_from_disk({data_dir!r}) failed: {type(e).__name__}: {e}"], 0
    if isinstance(ds, datasets.DatasetDict):
        return [f"{data_dir} holds a DatasetDict (splits {list(ds)}); the real script needs one Dataset, as "
                f"get_dataset.py saves lm_datasets['train']"], 0
    problems = []
    missing = [c for c in COLUMNS if c not in ds.column_names]
    if missing:
        problems.append(f"dataset {data_dir} lacks column(s) {', '.join(missing)} (has {', '.join(ds.column_names)}); "
                        f"the training loop reads input_ids, attention_mask and labels")
    n = len(ds)
    if n == 0:
        problems.append(f"dataset {data_dir} is empty")
    if not missing and n:
        for i in sorted({0, n - 1}):
            row = ds[i]
            lens = {c: len(row[c]) for c in COLUMNS}
            if any(v != args.seq_len for v in lens.values()):
                problems.append(f"dataset row {i} has lengths {lens}, not seq_len {args.seq_len} (get_dataset.py "
                                f"packs 4096-token blocks for Llama-2: --llama-version 2)")
                break
    if dp_size and n and not problems:
        per_rank = n // dp_size  # DistributedSampler(drop_last=True), DataLoader(drop_last=True)
        micro = per_rank // max(1, args.batch_size)
        if micro < args.grad_accum_usteps:
            problems.append(f"{n} rows over {dp_size} data-parallel ranks give {micro} micro-batches of "
                            f"{args.batch_size} per rank per epoch, fewer than grad_accum_usteps "
                            f"{args.grad_accum_usteps}: an epoch ends before an optimizer step (UnboundLocalError)")
    return problems, n


# ------------------------------------------------------------------------------------- checkpoint storage


class Storage:
    """The part of NxD's checkpoint storage the stand-in needs: local folder or s3://bucket/prefix."""

    def __init__(self, dirname: str):
        self.dirname = dirname
        self.s3 = dirname.startswith("s3://")
        if self.s3:
            import boto3

            bucket, _, key = dirname[len("s3://"):].partition("/")
            self.bucket, self.base = bucket, (key.rstrip("/") + "/") if key else ""
            self.client = boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None)

    def write(self, rel: str, data: bytes) -> None:
        if self.s3:
            self.client.put_object(Bucket=self.bucket, Key=self.base + rel, Body=data)
        else:
            path = os.path.join(self.dirname, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)

    def read(self, rel: str) -> bytes:
        if self.s3:
            return self.client.get_object(Bucket=self.bucket, Key=self.base + rel)["Body"].read()
        with open(os.path.join(self.dirname, rel), "rb") as f:
            return f.read()

    def exists(self, rel: str) -> bool:
        if self.s3:
            return bool(self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.base + rel,
                                                    MaxKeys=1).get("KeyCount"))
        return os.path.exists(os.path.join(self.dirname, rel))

    def tags(self, marker: str) -> list[tuple[float, str]]:
        """(mtime of tag/marker, tag) for each tag holding `marker` ("checkpoint" or "done")."""
        out = []
        if self.s3:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.base)
            for page in pages:
                for obj in page.get("Contents", []):
                    parts = obj["Key"][len(self.base):].split("/")
                    if len(parts) == 2 and parts[1] == marker:
                        out.append((obj["LastModified"].timestamp(), parts[0]))
        elif os.path.isdir(self.dirname):
            for tag in os.listdir(self.dirname):
                p = os.path.join(self.dirname, tag, marker)
                if os.path.isfile(p):
                    out.append((os.path.getmtime(p), tag))
        return out

    def remove_tag(self, tag: str) -> None:
        if self.s3:
            keys = [o["Key"] for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=f"{self.base}{tag}/") for o in page.get("Contents", [])]
            for i in range(0, len(keys), 1000):
                self.client.delete_objects(Bucket=self.bucket,
                                           Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]]})
        else:
            import shutil

            shutil.rmtree(os.path.join(self.dirname, tag), ignore_errors=True)


def _step_of(tag: str) -> int:
    try:
        return int(tag.split("_", 1)[1])
    except (IndexError, ValueError):
        return -1


def completed_tags(store: Storage) -> list[str]:
    """Oldest first, as NxD's list_completed_checkpoint_tags (sorted by modification time; ties by step)."""
    return [t for _, t in sorted(store.tags("done"), key=lambda x: (x[0], _step_of(x[1])))]


def save_checkpoint(store: Storage, tag: str, args, epoch: int, global_step: int, tp: int, dp: int,
                    num_kept: int) -> None:
    """nxd.save_checkpoint's layout (checkpoint.py save_checkpoint/_get_path/CheckpointIOState):
    <dir>/<tag>/checkpoint, model/dp_rank_00_tp_rank_XX_pp_rank_00.pt, optim/dp_rank_XX_tp_rank_XX_pp_rank_00.pt
    (dp rank varies with ZeRO-1), scheduler.pt, user_content.pt, then <tag>/done; then older tags removed."""
    store.write(f"{tag}/checkpoint", b"1")
    for t in range(tp):
        store.write(f"{tag}/model/dp_rank_00_tp_rank_{t:02d}_pp_rank_00.pt", b"stand-in model shard")
        for d in range(dp if args.use_zero_1 else 1):
            store.write(f"{tag}/optim/dp_rank_{d:02d}_tp_rank_{t:02d}_pp_rank_00.pt", b"stand-in optimizer shard")
    store.write(f"{tag}/scheduler.pt", pickle.dumps({"last_epoch": global_step}))
    store.write(f"{tag}/user_content.pt",
                pickle.dumps({"epoch": epoch, "global_step": global_step, "cli_args": vars(args)}))
    store.write(f"{tag}/done", b"1")
    print(f"saved checkpoint {tag} to {store.dirname}", flush=True)
    done = completed_tags(store)
    remove = [t for _, t in store.tags("checkpoint") if t not in done]  # corrupted: no "done"
    if num_kept is not None and num_kept != -1 and len(done) > num_kept:
        remove += done[:len(done) - num_kept]
    for t in remove:
        print(f"removing previous checkpoint in {t}", flush=True)
        store.remove_tag(t)


# ------------------------------------------------------------------------------------------------- main


def lr_at(step: int, args) -> float:
    """transformers.get_linear_schedule_with_warmup (L369)."""
    if step < args.warmup_steps:
        return args.lr * step / max(1, args.warmup_steps)
    return args.lr * max(0.0, (args.max_steps - step) / max(1, args.max_steps - args.warmup_steps))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)  # unknown flag: exit 2

    problems = check_steps(args) + check_local_modules()
    env_problems, dist = check_env(args)
    problems += env_problems
    cfg_problems, cfg = load_config(args)
    problems += cfg_problems
    if cfg is not None:
        arith, _ = head_arithmetic(cfg, args.tensor_parallel_size, args.kv_replicator, args.qkv_linear,
                                   args.hidden_size, args.context_parallel_size, args.use_flash_attention,
                                   args.seq_len, args.sequence_parallel_enabled, args.fuse_qkv)
        problems += arith
    dp = None
    if "WORLD_SIZE" in dist and args.tensor_parallel_size > 0 and args.context_parallel_size > 0:
        dp = max(1, dist["WORLD_SIZE"] // (args.tensor_parallel_size * args.context_parallel_size))
    needs_dir = (args.loading_step != "-1" or args.pretrained_weight
                 or (args.checkpoint_freq > 0 and args.max_steps is not None
                     and args.checkpoint_freq <= max(args.max_steps, args.steps_this_run or 0)))
    if needs_dir and not args.checkpoint_dir:
        problems.append("--checkpoint_dir is missing but checkpoints are saved or loaded (checkpoint_freq "
                        f"{args.checkpoint_freq}, loading_step {args.loading_step}): NxD would fail on None")
    data_problems, rows = check_data(args, dp)
    problems += data_problems
    if problems:
        print(f"tp_zero1_llama_hf_pretrain (stand-in): refused, {len(problems)} problem(s):", file=sys.stderr)
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        return 1

    if args.steps_this_run < 0:
        args.steps_this_run = args.max_steps
    rank, world = dist["RANK"], dist["WORLD_SIZE"]
    is_root = rank == 0
    tp = args.tensor_parallel_size
    store = Storage(args.checkpoint_dir) if args.checkpoint_dir else None

    epoch = global_step = 0
    tag = None
    if args.loading_step == "latest_if_exists":
        tags = completed_tags(store)
        tag = tags[-1] if tags else None
    elif args.loading_step != "-1":
        tag = f"step_{args.loading_step}"
        if not store.exists(f"{tag}/done"):
            print(f"Error: no checkpoint {tag} under directory {args.checkpoint_dir}", file=sys.stderr)
            return 1
    if tag is not None:
        user = pickle.loads(store.read(f"{tag}/user_content.pt"))
        epoch, global_step = user["epoch"], user["global_step"]
        print(f"resumed from step {global_step} ({args.checkpoint_dir}/{tag})", flush=True)
    elif args.pretrained_weight:
        if not store.exists("pretrained_weight/model"):
            print(f"Error: --pretrained_weight but no {args.checkpoint_dir}/pretrained_weight/model",
                  file=sys.stderr)
            return 1
        print(f"loaded pretrained weights from {args.checkpoint_dir}/pretrained_weight", flush=True)

    if is_root:
        os.makedirs(args.output_dir, exist_ok=True)
        print("--------TRAINING CONFIG----------")
        print(args)
        print(f"world size {world}, data parallel {dp}, tensor parallel {tp}, {rows} rows of {args.seq_len} tokens")
        print("---------------------------------", flush=True)
    seqs_per_step = args.batch_size * dp * args.grad_accum_usteps
    start, last = time.time(), time.time()
    loss = 10.0
    print(f"Epoch {epoch} begin {time.asctime()}", flush=True)
    while True:  # one optimizer step per pass; the real loop checks the stop after stepping (L354)
        global_step += 1
        loss = loss * 0.97 + 0.01
        if is_root and global_step % args.logging_interval == 0:
            now = time.time()
            thr = seqs_per_step * args.logging_interval / max(now - last, 1e-6)
            last = now
            print(f"LOG {time.asctime()} - ({epoch}, {global_step}) step_loss : {loss:.4f} "
                  f"learning_rate : {lr_at(global_step, args):.2e} throughput : {thr:.2f} seq/s ", flush=True)
        if args.checkpoint_freq > 0 and global_step % args.checkpoint_freq == 0 and is_root:
            save_checkpoint(store, f"step_{global_step}", args, epoch, global_step, tp, dp, args.num_kept_checkpoint)
        if global_step >= args.steps_this_run:
            break
    if is_root:
        print(f"Epoch {epoch} step {global_step} end {time.asctime()} loss {loss} (stand-in: no model was trained; "
              f"{time.time() - start:.3f}s)", flush=True)
        with open(args.metrics_file, "w") as f:
            json.dump({"results": {"metrics": [{"MetricName": "Final loss", "MeasuredValue": loss, "Units": "",
                                                "Timestamp": datetime.now(timezone.utc).isoformat(),
                                                "AdditionalData": {"Epoch": epoch, "Global step": global_step}}]}},
                      f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
