"""Read a torchtitan ``JobConfig`` TOML (``[job] [model] [optimizer] [lr_scheduler] [training] [parallelism]
[checkpoint] ...``) as a stoker :class:`~stoker.train.settings.TrainConfig`.

``python -m stoker.train --config llama3_debug.toml`` detects the format by its sections (or take
``--config-format torchtitan``). Every torchtitan key is in :data:`SPEC` with what stoker does with it:

* ``map``    - converted to its stoker setting (``training.max_norm`` -> ``train.grad_clip``);
* ``ignore`` - no effect on training in either tool (a description, a folder of a feature left off);
* ``warn``   - a value other than torchtitan's default asks for a feature that only changes speed, memory
  or logging, which stoker does not have: one warning line, training goes on with the same math;
* ``error``  - a value other than the default changes what is trained (float8, pipeline parallel, ...):
  one :class:`~stoker.errors.ConfigError` line naming the key, the reason and the fix.

Missing keys take torchtitan's defaults (so ``mixed_precision_param`` is ``bfloat16`` unless set), those
of its TOML-configured JobConfig; older key names (``training.batch_size``, ``checkpoint.enable_checkpoint``,
``lr_scheduler.lr_min``, ``model.tokenizer_path``) are read too.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stoker.errors import ConfigError

log = logging.getLogger(__name__)

# (section, key) -> (torchtitan default, kind, stoker setting or the reason)
SPEC: dict[str, dict[str, tuple[Any, str, str]]] = {
    "job": {
        "dump_folder": ("./torchtitan/outputs", "map", "out_dir"),
        "description": ("default job", "ignore", "a label; stoker's runs are named by out_dir"),
        "config_file": (None, "ignore", "the file itself"),
        "use_for_integration_test": (False, "ignore", "torchtitan's own test suite"),
        "print_args": (False, "warn", "use --print-config to print the resolved stoker config"),
        "print_config": (False, "warn", "use --print-config to print the resolved stoker config"),
        "save_config_file": (None, "ignore", "stoker writes the resolved config to <dump_folder>/config.json"),
        "custom_config_module": ("", "error", "stoker reads torchtitan's own JobConfig keys only"),
    },
    "model": {
        "name": ("llama3", "map", "only llama3 (stoker trains Llama models)"),
        "flavor": ("debugmodel", "map", "model.name (debugmodel, 8B, 70B, 405B)"),
        "hf_assets_path": ("./tests/assets/tokenizer", "map", "the tokenizer used to prepare the data"),
        "tokenizer_path": (None, "map", "the tokenizer used to prepare the data (older name)"),
        "converters": ([], "error", "stoker has no float8 / MX training (torchao); train in bf16 instead"),
        "print_after_conversion": (False, "ignore", "no converters in stoker"),
    },
    "optimizer": {
        "name": ("AdamW", "map", "AdamW only (Adam only with weight_decay = 0)"),
        "lr": (8e-4, "map", "train.lr"),
        "beta1": (0.9, "map", "train.beta1"),
        "beta2": (0.95, "map", "train.beta2"),
        "eps": (1e-8, "map", "train.eps"),
        "weight_decay": (0.1, "map", "train.weight_decay (stoker does not decay norm weights)"),
        "implementation": ("fused", "warn", "stoker uses the fused AdamW kernel wherever torch has it"),
        "early_step_in_backward": (False, "error", "stoker steps the optimizer after the backward pass"),
    },
    "lr_scheduler": {
        "warmup_steps": (200, "map", "train.warmup_steps"),
        "decay_ratio": (None, "map", "decay over the remaining steps only; a stable (WSD) phase is an error"),
        "decay_type": ("linear", "map", "train.schedule: linear, cosine (sqrt is an error)"),
        "min_lr_factor": (0.0, "map", "train.min_lr = lr x min_lr_factor"),
        "lr_min": (0.0, "map", "train.min_lr = lr x lr_min (older name of min_lr_factor)"),
    },
    "training": {
        "dataset": ("c4_test", "map", "data: a stoker.data source (shakespeare, hf:name, a corpus path)"),
        "dataset_path": (None, "map", "data.url: a prepared dataset, a .bin/.npy token file or a corpus"),
        "local_batch_size": (8, "map", "train.micro_batch_size"),
        "batch_size": (None, "map", "train.micro_batch_size (older name)"),
        "global_batch_size": (-1, "map", "train.global_batch_size (-1 -> 0: micro x dp)"),
        "seq_len": (2048, "map", "model.max_seq_len and the data's block size (seq_len + 1)"),
        "max_norm": (1.0, "map", "train.grad_clip"),
        "steps": (10000, "map", "train.steps"),
        "seed": (None, "map", "train.seed (unset -> 0)"),
        "mixed_precision_param": ("bfloat16", "map", "parallel.precision: bfloat16 -> bf16, float32 -> fp32"),
        "mixed_precision_reduce": ("float32", "map", "stoker reduces gradients in fp32"),
        "compile": (False, "map", "parallel.compile (older name of [compile] enable)"),
        "enable_cpu_offload": (False, "error", "stoker keeps parameters and optimizer state on the device"),
        "deterministic": (False, "warn", "stoker does not switch torch to deterministic algorithms"),
        "gc_freq": (50, "warn", "stoker leaves Python's garbage collector alone"),
        "gc_debug": (False, "warn", "stoker leaves Python's garbage collector alone"),
        "max_steps": (-1, "error", "stoker's schedule decays over training.steps; set steps instead"),
        "dtype": ("float32", "error", "stoker keeps fp32 master weights; use mixed_precision_param = 'bfloat16'"),
        "dataloader": ({}, "ignore", "stoker's loader reads memory-mapped token blocks (no worker processes)"),
    },
    "parallelism": {
        "data_parallel_replicate_degree": (1, "map", "parallel.dp with dp_mode = ddp"),
        "data_parallel_shard_degree": (-1, "map", "parallel.dp with dp_mode = fsdp (-1: the ranks left)"),
        "tensor_parallel_degree": (1, "map", "parallel.tp, with parallel.sequence_parallel = true"),
        "fsdp_reshard_after_forward": ("default", "warn",
                                       "stoker reshards every block but the last (torchtitan's default)"),
        "disable_loss_parallel": (False, "map", "parallel.loss_parallel = not disable_loss_parallel"),
        "enable_async_tensor_parallel": (False, "warn", "no async TP in stoker"),
        "enable_compiled_autograd": (False, "warn", "no compiled autograd in stoker"),
        "pipeline_parallel_degree": (1, "error", "stoker has no pipeline parallelism; use TP and FSDP"),
        "context_parallel_degree": (1, "error", "stoker has no context parallelism; shorten seq_len or use TP"),
        "expert_parallel_degree": (1, "error", "stoker trains dense models (no experts)"),
        "expert_tensor_parallel_degree": (1, "error", "stoker trains dense models (no experts)"),
        **{key: (default, "ignore", "acts only with pipeline, context or expert parallel (errors above)")
           for key, default in (
               ("pipeline_parallel_schedule", "1F1B"), ("pipeline_parallel_schedule_csv", ""),
               ("pipeline_parallel_microbatch_size", 1), ("pipeline_parallel_split_points", []),
               ("pipeline_parallel_layers_per_stage", None), ("pipeline_parallel_first_stage_less_layers", 1),
               ("pipeline_parallel_last_stage_less_layers", 1), ("module_fqns_per_model_part", None),
               ("pipeline_parallel_expert_parallel_overlap", True), ("context_parallel_rotate_method", "allgather"),
               ("context_parallel_load_balancer", "headtail"), ("expert_parallel_comm_backend", "standard"))},
    },
    "checkpoint": {
        "enable": (False, "map", "off: no checkpoints saved or loaded; on: checkpoint.every / save_final"),
        "enable_checkpoint": (None, "map", "older name of enable"),
        "folder": ("checkpoint", "map", "checkpoint.dir = <dump_folder>/<folder>"),
        "interval": (500, "map", "checkpoint.every"),
        "keep_latest_k": (10, "map", "checkpoint.keep (0: keep all)"),
        "async_mode": ("disabled", "map", "checkpoint.async_save (async and async_with_pinned_mem -> true)"),
        "load_step": (-1, "map", "checkpoint.resume_from = <dir>/step_XXXXXXXX"),
        "initial_load_path": (None, "map",
                              "model.init_from (a stoker checkpoint, or a HF folder with initial_load_in_hf)"),
        "initial_load_model_only": (True, "map", "false is an error: pass --resume-from to continue a run"),
        "initial_load_in_hf": (False, "map", "initial_load_path is a Hugging Face folder (model.init_from reads it)"),
        "last_save_model_only": (True, "map", "true warns: stoker's last checkpoint keeps the optimizer too (it can "
                                 "resume); export the weights with python -m stoker.train.hf"),
        "last_save_model_weights_only": (None, "map", "older name of last_save_model_only"),
        "model_weights_only": (None, "map", "older name of last_save_model_only"),
        "export_dtype": ("float32", "map", "other than float32 warns: export with python -m stoker.train.hf --dtype"),
        "last_save_in_hf": (False, "warn", "export with python -m stoker.train.hf CKPT OUT"),
        "enable_first_step_checkpoint": (False, "warn", "set checkpoint.every = 1 to test checkpointing"),
        "skip_last_save": (False, "map", "checkpoint.save_final = false"),
        "load_only": (False, "map", "no checkpoints saved (checkpoint.every = 0, save_final = false)"),
        "initial_load_in_hf_quantized": (False, "error", "model.init_from reads unquantized HF weights only"),
        "enable_ft_dataloader_checkpoints": (True, "ignore",
                                             "TorchFT only; stoker's checkpoints hold the data position"),
        "create_seed_checkpoint": (False, "error",
                                   "stoker initializes the same weights on any layout; no seed checkpoint needed"),
        "exclude_from_loading": ([], "error",
                                 "stoker loads the whole state; use --set model.init_from=CKPT for weights only"),
    },
    "activation_checkpoint": {
        "mode": ("selective", "map", "parallel.activation_checkpoint: none, selective, full"),
        "selective_ac_option": ("2", "map", "stoker's selective AC is per op ('op'); every-Nth-layer values warn"),
        "per_op_sac_force_recompute_mm_shapes_by_fqns": (["moe.router.gate"], "ignore", "MoE only"),
    },
    "compile": {
        "enable": (False, "map", "parallel.compile (torch.compile per block)"),
        "components": (["model", "loss"], "map", "parallel.compile only when 'model' is listed"),
        "backend": ("inductor", "warn", "stoker compiles with inductor"),
    },
    "metrics": {
        "log_freq": (10, "map", "train.log_every"),
        "enable_tensorboard": (False, "map", "metrics.tensorboard (files in <dump_folder>/tensorboard)"),
        "save_tb_folder": ("tb", "ignore", "stoker writes TensorBoard files to <dump_folder>/tensorboard"),
        "disable_color_printing": (False, "map", "metrics.progress = false (no progress bar)"),
        "save_for_all_ranks": (False, "warn", "rank 0 writes the metrics"),
        "enable_wandb": (False, "warn", "no Weights & Biases; metrics are in metrics.jsonl and TensorBoard"),
        "wandb_project": ("", "ignore", "no Weights & Biases"),
        "wandb_run_name": ("", "ignore", "no Weights & Biases"),
    },
    "profiling": {
        "enable_profiling": (False, "warn", "no profiler traces in stoker"),
        "enable_memory_snapshot": (False, "warn", "no memory snapshots in stoker; metrics.jsonl has mem_*"),
        "save_traces_folder": ("profile_traces", "ignore", "no profiler"),
        "profile_freq": (10, "ignore", "no profiler"),
        "profiler_active": (1, "ignore", "no profiler"),
        "profiler_warmup": (3, "ignore", "no profiler"),
        "save_memory_snapshot_folder": ("memory_snapshot", "ignore", "no memory snapshots"),
    },
    "comm": {
        "init_timeout_seconds": (300, "warn", "stoker keeps torch's process-group timeouts"),
        "train_timeout_seconds": (100, "warn", "stoker keeps torch's process-group timeouts"),
        "trace_buf_size": (20000, "ignore", "flight recorder settings"),
        "save_traces_folder": ("comm_traces", "ignore", "flight recorder settings"),
    },
    "memory_estimation": {
        "enabled": (False, "warn", "no memory estimation in stoker"),
        "disable_fake_mode": (False, "ignore", "no memory estimation"),
    },
    "fault_tolerance": {
        "enable": (False, "error", "no TorchFT; stoker retries a failed gang from its last checkpoint"),
    },
    "experimental": {
        "custom_import": ("", "error", "stoker trains its own Llama; no custom modules"),
        "custom_args_module": ("", "error", "stoker trains its own Llama; no custom modules"),
    },
    "validation": {
        "enabled": (False, "warn", "evaluate after training: python -m stoker.train.evaluate CKPT --data DS"),
    },
}
# sections whose other keys only act with a switch that is checked above (float8 needs model.converters,
# the validation and fault-tolerance settings their `enabled` / `enable`): any key is accepted there
OPEN_SECTIONS = ("float8", "mx", "quantize", "validation", "fault_tolerance")
STOKER_SECTIONS = ("train", "data", "parallel")  # a file with these and torchtitan's is ambiguous
FLAVORS = {"debugmodel": "llama3-debugmodel", "debugmodel_flex_attn": "llama3-debugmodel", "8B": "llama3.1-8b",
           "70B": "llama3.1-70b", "405B": "llama3.1-405b"}
C4_NAMES = ("c4", "c4_test", "c4_validation")
_TORCHTITAN_ONLY = set(SPEC) - {"model", "checkpoint", "metrics"} | set(OPEN_SECTIONS)


def is_torchtitan(raw: dict[str, Any]) -> bool:
    """Whether a TOML document is torchtitan's layout (a section stoker's own format does not have)."""
    return any(isinstance(v, dict) and k in _TORCHTITAN_ONLY for k, v in raw.items())


def is_torchtitan_key(key: str) -> bool:
    """Whether a ``section.key`` override names a torchtitan setting (applied before conversion)."""
    section, _, name = key.partition(".")
    if section in _TORCHTITAN_ONLY:
        return True
    return section in SPEC and name in SPEC[section]


def _say(message: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        log.warning("torchtitan config: %s", message)


def _read(raw: dict[str, Any], source: str) -> dict[str, dict[str, Any]]:
    """Every section with torchtitan's defaults filled in; unknown sections/keys and wrong types refused,
    warn/error keys with a non-default value reported."""
    for section, value in raw.items():
        if section in STOKER_SECTIONS or section == "out_dir":
            raise ConfigError(f"{source}: [{section}] is stoker's format but the file is torchtitan's ([job], "
                              "[training], ...); use one format per file (see docs/from-torchtitan.md)")
        if section not in SPEC and section not in OPEN_SECTIONS:
            raise ConfigError(f"{source}: unknown torchtitan section [{section}]; stoker reads "
                              f"{sorted(set(SPEC) | set(OPEN_SECTIONS))}")
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {section} = {value!r} must be a table ([{section}])")
    t: dict[str, dict[str, Any]] = {}
    for section in set(SPEC) | set(OPEN_SECTIONS):
        given = dict(raw.get(section, {}))
        spec = SPEC.get(section, {})
        for key, value in given.items():
            if key not in spec:
                if section in OPEN_SECTIONS:
                    continue
                raise ConfigError(f"{source}: unknown torchtitan key {section}.{key}; known in [{section}]: "
                                  f"{sorted(spec)}")
            default, kind, why = spec[key]
            _check_type(f"{section}.{key}", value, default, source)
            if value != default and kind in ("warn", "error") and value is not None:
                if kind == "error":
                    raise ConfigError(f"{section}.{key} = {value!r} is not supported: {why}")
                _say(f"{section}.{key} = {value!r} is ignored: {why}")
        t[section] = {**{k: d for k, (d, _, _) in spec.items()}, **given}
    return t


# the type of each key whose default is None (unset), for the type check below
_UNSET_TYPES: dict[str, Any] = {
    "lr_scheduler.decay_ratio": 0.5, "training.dataset_path": "path", "training.seed": 0, "training.batch_size": 8,
    "checkpoint.initial_load_path": "path", "checkpoint.enable_checkpoint": False, "model.tokenizer_path": "path",
    "checkpoint.last_save_model_weights_only": False, "checkpoint.model_weights_only": False, "job.config_file": "",
    "job.save_config_file": "", "parallelism.pipeline_parallel_layers_per_stage": 1,
    "parallelism.module_fqns_per_model_part": [],
}


def _check_type(key: str, value: Any, default: Any, source: str) -> None:
    default = _UNSET_TYPES.get(key) if default is None else default
    if default is None or value is None:
        return
    ok = {bool: lambda v: isinstance(v, bool),
          int: lambda v: isinstance(v, int) and not isinstance(v, bool),
          float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          str: lambda v: isinstance(v, str), list: lambda v: isinstance(v, (list, str)),
          dict: lambda v: isinstance(v, dict)}[type(default)](value)
    if not ok:
        raise ConfigError(f"{key} = {value!r}: expected {type(default).__name__} like {default!r} (in {source})")


def _first(values: dict[str, Any], *keys: str) -> Any:
    """The first of ``keys`` (new name first, then older names) given explicitly, else the first's default."""
    for key in keys[1:]:
        if values.get(key) is not None:
            return values[key]
    return values[keys[0]]


def convert(raw: dict[str, Any], *, source: str = "config", world_size: int | None = None,
            data_url: str | None = None, prepare_data: bool = True) -> dict[str, Any]:
    """A stoker config dict (TOML layout of :func:`stoker.train.config.from_dict`) from torchtitan's.

    ``data_url`` (``--data``) replaces the data of ``[training]``; otherwise a corpus or a stoker.data
    source is prepared (tokenized, cached by fingerprint) with the tokenizer of ``[model]``."""
    t = _read(raw, source)
    ws = int(os.environ.get("WORLD_SIZE", "1")) if world_size is None else world_size
    job, model, opt, sched, tr = t["job"], t["model"], t["optimizer"], t["lr_scheduler"], t["training"]
    par, ckpt, ac, comp, met = t["parallelism"], t["checkpoint"], t["activation_checkpoint"], t["compile"], t["metrics"]

    if model["name"] != "llama3":
        raise ConfigError(f"model.name = {model['name']!r} is not supported: stoker trains Llama models; "
                          f"use name = 'llama3' with a flavor in {sorted(FLAVORS)}")
    if model["flavor"] not in FLAVORS:
        raise ConfigError(f"model.flavor = {model['flavor']!r} is not a torchtitan llama3 flavor stoker knows; "
                          f"use one of {sorted(FLAVORS)}, or stoker's format with any shape")
    if model["flavor"] == "debugmodel_flex_attn":
        _say("model.flavor = 'debugmodel_flex_attn': stoker attends causally over the whole block (SDPA), "
             "not per document; training as 'debugmodel'")
    seq_len = tr["seq_len"]
    out: dict[str, Any] = {"out_dir": job["dump_folder"]}
    out["model"] = {"name": FLAVORS[model["flavor"]], "max_seq_len": seq_len}

    name = opt["name"]
    if name.lower() == "adam" and opt["weight_decay"] == 0:
        name = "AdamW"  # the same update without weight decay
    if name.lower() != "adamw":
        raise ConfigError(f"optimizer.name = {opt['name']!r} is not supported: stoker trains with AdamW "
                          "(Adam is accepted with weight_decay = 0)")
    lr = float(opt["lr"])
    factor = float(_first(sched, "min_lr_factor", "lr_min"))
    if sched["decay_type"] not in ("linear", "cosine"):
        raise ConfigError(f"lr_scheduler.decay_type = {sched['decay_type']!r} is not supported: stoker decays "
                          "'linear' or 'cosine'")
    steps, warmup = tr["steps"], sched["warmup_steps"]
    if sched["decay_ratio"] is not None:
        stable = steps - warmup - round(steps * sched["decay_ratio"])
        if stable < 0:  # torchtitan then decays right after warmup and stops before reaching the end
            _say(f"lr_scheduler.decay_ratio = {sched['decay_ratio']}: warmup ({warmup}) and decay "
                 f"({round(steps * sched['decay_ratio'])}) exceed the {steps} steps; stoker decays over the "
                 f"{max(0, steps - warmup)} steps after warmup and reaches min_lr at the last one")
        elif stable > 0:
            raise ConfigError(
                f"lr_scheduler.decay_ratio = {sched['decay_ratio']} gives a stable phase of {stable} steps "
                f"(warmup {warmup}, steps {steps}): stoker has no warmup-stable-decay schedule; remove decay_ratio "
                f"or set it to {(steps - warmup) / steps:g} (decay over all steps after warmup)")
    out["train"] = {
        "steps": steps, "micro_batch_size": _first(tr, "local_batch_size", "batch_size"),
        "global_batch_size": max(0, tr["global_batch_size"]), "lr": lr, "min_lr": lr * factor,
        "warmup_steps": warmup, "schedule": sched["decay_type"], "weight_decay": float(opt["weight_decay"]),
        "beta1": float(opt["beta1"]), "beta2": float(opt["beta2"]), "eps": float(opt["eps"]),
        "grad_clip": float(tr["max_norm"]), "seed": 0 if tr["seed"] is None else tr["seed"],
        "log_every": met["log_freq"],
    }
    if tr["mixed_precision_reduce"] != "float32":
        raise ConfigError(f"training.mixed_precision_reduce = {tr['mixed_precision_reduce']!r} is not supported: "
                          "stoker reduces gradients in float32")
    precision = {"bfloat16": "bf16", "float32": "fp32"}.get(tr["mixed_precision_param"])
    if precision is None:
        raise ConfigError(f"training.mixed_precision_param = {tr['mixed_precision_param']!r}: use 'bfloat16' or "
                          "'float32'")
    out["parallel"] = {"precision": precision, **_parallel(par, ws),
                       "compile": bool(comp["enable"] or tr["compile"]) and "model" in comp["components"]}
    mode = ac["mode"]
    if mode not in ("none", "selective", "full"):
        raise ConfigError(f"activation_checkpoint.mode = {mode!r} is not supported: use 'none', 'selective' or "
                          "'full'")
    if mode == "selective" and str(ac["selective_ac_option"]) != "op":
        _say(f"activation_checkpoint.selective_ac_option = {ac['selective_ac_option']!r}: stoker's selective "
             "checkpointing is per op (like 'op'): it keeps matmul and attention outputs in every block")
    out["parallel"]["activation_checkpoint"] = mode
    out["checkpoint"] = _checkpoint(ckpt, job["dump_folder"], out["model"])
    out["metrics"] = {"tensorboard": met["enable_tensorboard"], "progress": not met["disable_color_printing"]}
    if data_url is None:
        out["data"] = _data(tr, model, seq_len, prepare=prepare_data)
    return out


def _parallel(par: dict[str, Any], world_size: int) -> dict[str, Any]:
    tp, rep = par["tensor_parallel_degree"], par["data_parallel_replicate_degree"]
    shard = par["data_parallel_shard_degree"]
    out: dict[str, Any] = {"tp": tp, "sequence_parallel": tp > 1,  # torchtitan's TP always shards the norms too
                           "loss_parallel": not par["disable_loss_parallel"]}
    if shard == -1:
        if rep == 1:
            return {**out, "dp": -1, "dp_mode": "fsdp"}  # FSDP over whatever ranks TP leaves
        shard = max(1, world_size // (rep * tp))
    if rep > 1 and shard > 1:
        raise ConfigError(f"parallelism.data_parallel_replicate_degree = {rep} with data_parallel_shard_degree = "
                          f"{shard} (HSDP) is not supported: stoker shards (FSDP) or replicates (DDP / ZeRO-1) over "
                          "all data-parallel ranks; set one of them to 1")
    if shard > 1:
        return {**out, "dp": shard, "dp_mode": "fsdp"}
    return {**out, "dp": rep, "dp_mode": "ddp"}


def _checkpoint(ckpt: dict[str, Any], dump_folder: str, model: dict[str, Any]) -> dict[str, Any]:
    enabled = bool(_first(ckpt, "enable", "enable_checkpoint"))
    if not enabled:  # torchtitan then neither saves nor loads anything
        for key, default in (("load_step", -1), ("initial_load_path", None)):
            if ckpt[key] != default:
                _say(f"checkpoint.{key} = {ckpt[key]!r} is ignored: checkpoint.enable is false")
        return {"every": 0, "save_final": False, "resume": "never"}
    if ckpt["initial_load_path"]:
        if not ckpt["initial_load_model_only"]:
            raise ConfigError("checkpoint.initial_load_model_only = false is not supported: to continue a run from "
                              "another folder pass --resume-from PATH (a stoker checkpoint)")
        model["init_from"] = ckpt["initial_load_path"]  # used only when the run has no checkpoint of its own
    if _first(ckpt, "last_save_model_only", "last_save_model_weights_only", "model_weights_only"):
        _say("checkpoint.last_save_model_only = true: stoker's last checkpoint also keeps the optimizer state (it "
             "can resume); export the weights with python -m stoker.train.hf CKPT OUT")
        if ckpt["export_dtype"] != "float32":
            _say(f"checkpoint.export_dtype = {ckpt['export_dtype']!r} is ignored: export with "
                 f"python -m stoker.train.hf CKPT OUT --dtype {ckpt['export_dtype']}")
    directory = str(Path(dump_folder) / ckpt["folder"])
    out = {"dir": directory, "every": 0 if ckpt["load_only"] else ckpt["interval"],
           "keep": ckpt["keep_latest_k"] or 2**31 - 1, "async_save": ckpt["async_mode"] != "disabled",
           "save_final": not (ckpt["skip_last_save"] or ckpt["load_only"]), "resume": "auto"}
    if ckpt["async_mode"] not in ("disabled", "async", "async_with_pinned_mem"):
        raise ConfigError(f"checkpoint.async_mode = {ckpt['async_mode']!r}: use 'disabled', 'async' or "
                          "'async_with_pinned_mem'")
    if ckpt["load_step"] != -1:
        out["resume_from"] = str(Path(directory) / f"step_{ckpt['load_step']:08d}")
    return out


def _data(tr: dict[str, Any], model: dict[str, Any], seq_len: int, *, prepare: bool) -> dict[str, Any]:
    """``[data]`` from ``training.dataset`` / ``dataset_path``: a prepared dataset or token file as it is,
    anything else (a corpus file or folder, 'shakespeare', 'hf:name') prepared with the model's tokenizer."""
    path, name = tr["dataset_path"], tr["dataset"]
    if path and Path(path).suffix in (".bin", ".npy"):
        return {"url": path, "block_size": seq_len + 1}
    if path and ((Path(path) / "manifest.json").is_file() or "://" in path):
        _check_block(path, seq_len)
        return {"url": path}
    corpus = path or name
    if not path and name in C4_NAMES:
        raise ConfigError(f"training.dataset = {name!r} is torchtitan's C4 loader, not bundled with stoker: pass "
                          "--data URL (a prepared dataset), set training.dataset_path (a prepared dataset or the "
                          "C4 json.gz files), or name a stoker.data source in training.dataset ('shakespeare', "
                          "'hf:allenai/c4:en')")
    tokenizer = model.get("tokenizer_path") or model["hf_assets_path"]
    if not Path(tokenizer).exists() and tokenizer not in ("llama", "gpt2"):
        raise ConfigError(f"model.hf_assets_path = {tokenizer!r} does not exist: point it at the tokenizer to "
                          f"prepare {corpus!r} with (a folder with tokenizer.json, a tokenizer.model), or "
                          "'llama' / 'gpt2'")
    if not prepare:
        return {"url": ""}
    return {"url": _prepare(corpus, tokenizer, seq_len + 1)}


def _check_block(url: str, seq_len: int) -> None:
    manifest = Path(url) / "manifest.json"
    if not manifest.is_file():
        return  # remote: the trainer reads it
    block = int(json.loads(manifest.read_text())["block_size"])
    if block != seq_len + 1:
        raise ConfigError(f"training.dataset_path {url} holds blocks of {block} tokens ({block - 1} positions) but "
                          f"training.seq_len = {seq_len}: set seq_len = {block - 1} or prepare the data with "
                          f"--block-size {seq_len + 1}")


def _prepare(corpus: str, tokenizer: str, block_size: int) -> str:
    """Prepare (or find in the cache) the dataset; ranks on one machine take turns, so one tokenizes."""
    from stoker.data import prepare

    key = hashlib.sha256(f"{corpus}\0{tokenizer}\0{block_size}".encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"stoker-prepare-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            ref = prepare(corpus, tokenizer=tokenizer, block_size=block_size, progress=False)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    if int(os.environ.get("RANK", "0")) == 0:
        log.info("torchtitan config: data %s tokenized with %s in blocks of %d -> %s", corpus, tokenizer,
                 block_size, ref.url)
    return ref.url


def dataset_vocab(url: str) -> int | None:
    """The tokenizer's vocabulary size of a prepared local dataset (torchtitan sizes the embedding by it)."""
    manifest = Path(url) / "manifest.json" if url and "://" not in url else None
    if manifest is None or not manifest.is_file():
        return None
    return int(json.loads(manifest.read_text())["tokenizer"]["vocab_size"])


def load(raw: dict[str, Any], overrides: list[str], source: str, *, aliases: Any,
         apply_overrides: Callable[[dict[str, Any], list[str]], Any]) -> dict[str, Any]:
    """stoker's config dict (for ``train.config.from_dict``) from a torchtitan TOML and the command line's
    overrides: torchtitan keys (``training.steps=5``) change the file before conversion, stoker's
    (``--set train.lr=1e-3``, ``--data``; ``aliases`` are stoker's short flags) the result. train.config passes
    its own override machinery in, so that this module does not import it back."""
    titan, stoker = [], []
    for item in overrides:
        key = item.split("=", 1)[0].strip().replace("-", "_")
        (titan if "." in key and key not in aliases and is_torchtitan_key(key) else stoker).append(item)
    apply_overrides(raw, titan)
    data_keys = {"data", "data.url"}
    given = next((i.split("=", 1)[1] for i in reversed(stoker)
                  if i.split("=", 1)[0].strip().replace("-", "_") in data_keys), None)
    out = convert(raw, source=source, data_url=given)
    apply_overrides(out, stoker)
    model = out["model"]
    vocab = dataset_vocab(str(out.get("data", {}).get("url", "")))
    if vocab is not None and "vocab_size" not in model:
        model["vocab_size"] = vocab  # the tokenizer's vocabulary, as torchtitan builds the model for it
    return out
