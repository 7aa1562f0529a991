"""Hugging Face interchange: export a stoker Llama as a ``transformers`` model folder, import one back.

    export_hf(model, cfg, "out/hf", dtype=torch.bfloat16, tokenizer="tokenizer.model")
    AutoModelForCausalLM.from_pretrained("out/hf")          # loads, gives the same logits
    cfg, state_dict = load_hf("out/hf")                      # back into stoker: Llama(cfg).load_state_dict(...)

stoker's module names follow torchtitan and its RoPE uses the rotate-half layout that Hugging Face's
Llama uses, so every weight maps one to one (no q/k permutation). A model sharded by tensor parallel or
FSDP2 (DTensor parameters) is gathered to full tensors on rank 0, which alone writes the folder; every
rank must call :func:`export_hf` because the gather is a collective.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stoker.errors import CheckpointError, ConfigError, StokerError
from stoker.train.model import LlamaConfig

log = logging.getLogger(__name__)

__all__ = ["to_hf_config", "from_hf_config", "to_hf_state_dict", "from_hf_state_dict", "full_state_dict",
           "export_hf", "load_hf", "load_hf_into", "load_checkpoint_weights", "export_from_checkpoint",
           "TOKENIZER_FILES"]

# stoker name pattern -> Hugging Face name pattern ({i} is the layer index)
_LAYER_MAP = {
    "attention_norm.weight": "input_layernorm.weight",
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
}
_TOP_MAP = {"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
            "output.weight": "lm_head.weight"}
_LAYER_MAP_INV = {v: k for k, v in _LAYER_MAP.items()}
_TOP_MAP_INV = {v: k for k, v in _TOP_MAP.items()}
# wrappers that torch.compile / activation checkpointing / FSDP1 put into parameter names
_WRAPPER_PREFIXES = ("_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.", "module.")
TOKENIZER_FILES = ("tokenizer.model", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


# --------------------------------------------------------------------------------------------- configs

def to_hf_config(cfg: LlamaConfig, **overrides: Any) -> Any:
    """The ``transformers.LlamaConfig`` of a stoker config (``overrides``: e.g. ``bos_token_id=1``)."""
    import transformers

    kwargs: dict[str, Any] = dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.ffn_dim,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.dim // cfg.n_heads, hidden_act="silu", max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tie_embeddings, attention_bias=False,
        mlp_bias=False, rope_theta=float(cfg.rope_theta), architectures=["LlamaForCausalLM"],
    )
    if cfg.rope_scaling is not None:
        rs = cfg.rope_scaling
        kwargs["rope_scaling"] = {
            "rope_type": "llama3", "factor": float(rs["factor"]), "low_freq_factor": float(rs["low_freq_factor"]),
            "high_freq_factor": float(rs["high_freq_factor"]),
            "original_max_position_embeddings": int(rs["original_max_position_embeddings"]),
        }
    kwargs.update(overrides)
    return transformers.LlamaConfig(**kwargs)


def from_hf_config(hf: Mapping[str, Any] | Any, source: str = "config.json") -> LlamaConfig:
    """A stoker config from a Hugging Face Llama ``config.json`` (a dict, or a ``transformers`` config).

    Reads both the transformers-4 keys (``rope_theta`` + ``rope_scaling``) and the transformers-5 key
    ``rope_parameters``. Raises ConfigError for a model stoker's Llama cannot represent."""
    d = dict(hf) if isinstance(hf, Mapping) else hf.to_dict()
    if d.get("model_type", "llama") != "llama":
        raise ConfigError(f"{source}: model_type is {d.get('model_type')!r}; stoker imports Llama models only")
    for key, want in (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False)):
        if d.get(key, want) != want:
            raise ConfigError(f"{source}: {key}={d[key]!r} is not supported (stoker's Llama has {key}={want!r})")
    heads = int(d["num_attention_heads"])
    if d.get("head_dim") not in (None, d["hidden_size"] // heads):
        raise ConfigError(f"{source}: head_dim={d['head_dim']} != hidden_size/num_attention_heads; not supported")
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if "full_attention" in rope:  # per-layer-type nesting (transformers 5)
        rope = rope["full_attention"]
    rope = dict(rope)
    theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    scaling = None
    if rope_type == "llama3":
        scaling = {k: rope[k] for k in ("factor", "low_freq_factor", "high_freq_factor",
                                        "original_max_position_embeddings")}
    elif rope_type != "default":
        raise ConfigError(f"{source}: rope type {rope_type!r} is not supported; stoker supports 'default' and 'llama3'")
    return LlamaConfig(
        dim=int(d["hidden_size"]), n_layers=int(d["num_hidden_layers"]), n_heads=heads,
        n_kv_heads=int(d.get("num_key_value_heads") or heads), vocab_size=int(d["vocab_size"]),
        ffn_dim=int(d["intermediate_size"]), norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta), rope_scaling=scaling, max_seq_len=int(d.get("max_position_embeddings", 2048)),
        tie_embeddings=bool(d.get("tie_word_embeddings", False)),
    )


# ---------------------------------------------------------------------------------------- state dicts

def _clean(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def to_hf_state_dict(sd: Mapping[str, torch.Tensor], cfg: LlamaConfig) -> dict[str, torch.Tensor]:
    """Rename a full stoker state dict to Hugging Face names (a tied output weight is left out)."""
    out: dict[str, torch.Tensor] = {}
    for raw, tensor in sd.items():
        name = _clean(raw)
        if name.startswith("rope_"):
            continue  # RoPE tables are recomputed from the config
        if name in _TOP_MAP:
            if name == "output.weight" and cfg.tie_embeddings:
                continue
            out[_TOP_MAP[name]] = tensor
            continue
        m = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
        if not m or m.group(2) not in _LAYER_MAP:
            raise CheckpointError(f"export: unexpected parameter {raw!r}; is this a stoker Llama state dict?")
        out[f"model.layers.{m.group(1)}.{_LAYER_MAP[m.group(2)]}"] = tensor
    _check_complete(out, cfg, hf=True)
    return out


def from_hf_state_dict(sd: Mapping[str, torch.Tensor], cfg: LlamaConfig) -> dict[str, torch.Tensor]:
    """Rename a Hugging Face Llama state dict to stoker names (``output.weight`` is the embedding if tied)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in sd.items():
        if name in _TOP_MAP_INV:
            out[_TOP_MAP_INV[name]] = tensor
            continue
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", name)
        if m and m.group(2) in _LAYER_MAP_INV:
            out[f"layers.{m.group(1)}.{_LAYER_MAP_INV[m.group(2)]}"] = tensor
        elif name.endswith("rotary_emb.inv_freq"):
            continue  # older checkpoints saved the RoPE buffer
        else:
            raise CheckpointError(f"import: unexpected weight {name!r}; not a Llama checkpoint stoker can read")
    if cfg.tie_embeddings:
        out["output.weight"] = out.get("tok_embeddings.weight", out.get("output.weight"))  # type: ignore[arg-type]
    _check_complete(out, cfg, hf=False)
    return out


def _expected(cfg: LlamaConfig, hf: bool) -> set[str]:
    names = set(_TOP_MAP) if not hf else {v for k, v in _TOP_MAP.items() if not (k == "output.weight"
                                                                                   and cfg.tie_embeddings)}
    per = _LAYER_MAP.values() if hf else _LAYER_MAP.keys()
    prefix = "model.layers" if hf else "layers"
    return names | {f"{prefix}.{i}.{p}" for i in range(cfg.n_layers) for p in per}


def _check_complete(sd: Mapping[str, torch.Tensor], cfg: LlamaConfig, hf: bool) -> None:
    missing = _expected(cfg, hf) - set(sd)
    if missing:
        raise CheckpointError(f"{'export' if hf else 'import'}: {len(missing)} weights missing, e.g. "
                              f"{sorted(missing)[:3]}; the weights do not match the model config")


def full_state_dict(model_or_sd: nn.Module | Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Full (unsharded) CPU tensors of a model or state dict; collective when distributed.

    Under ``torch.distributed`` every rank must call this; rank 0 gets the tensors, the others ``{}``.
    """
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    distributed = dist.is_available() and dist.is_initialized()
    if isinstance(model_or_sd, nn.Module):
        if distributed:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            sd = get_model_state_dict(model_or_sd,
                                      options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        else:
            sd = model_or_sd.state_dict()
    else:
        sd = dict(model_or_sd)
    keep = not distributed or dist.get_rank() == 0
    out: dict[str, torch.Tensor] = {}
    for name, t in sd.items():
        if isinstance(t, DTensor):
            t = t.full_tensor()  # collective over the tensor's mesh: every rank takes part
        if keep and isinstance(t, torch.Tensor):
            out[name] = t.detach().cpu()  # one full copy, on rank 0 only
    return out


# ------------------------------------------------------------------------------------------- export

def _save_shards(tensors: dict[str, torch.Tensor], out: Path, max_shard_bytes: int) -> list[str]:
    from safetensors.torch import save_file

    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata={"format": "pt"})
        return ["model.safetensors"]
    files, weight_map = [], {}
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        files.append(fname)
        weight_map.update({k: fname for k in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True))
    return files + ["model.safetensors.index.json"]


def _copy_tokenizer(tokenizer: str | os.PathLike[str], out: Path) -> list[str]:
    src = Path(tokenizer)
    if src.is_dir():
        found = [src / f for f in TOKENIZER_FILES if (src / f).is_file()]
        if not found:
            raise ConfigError(f"export: tokenizer folder {src} holds none of {TOKENIZER_FILES}")
    elif src.is_file():
        found = [src]
    else:
        raise ConfigError(f"export: tokenizer {src} does not exist; give a tokenizer.model/tokenizer.json file "
                          "or a folder holding them")
    names = []
    for f in found:  # a SentencePiece file under another name (mistral-common's tokenizer.model.v1) -> tokenizer.model
        name = "tokenizer.model" if f.name.startswith("tokenizer.model") or f.suffix == ".model" else f.name
        shutil.copyfile(f, out / name)
        names.append(name)
    if "tokenizer.model" in names and "tokenizer.json" not in names:
        from stoker.data.hf_tokenizer import write_hf_tokenizer

        names += write_hf_tokenizer(out / "tokenizer.model", out)  # AutoTokenizer needs no protobuf then
    return names


def check_output_folder(out_dir: str | os.PathLike[str]) -> Path:
    """``out_dir`` if the export can be written there (a folder, or a path whose nearest existing parent is a
    writable folder); else a ConfigError in one line. Nothing is created."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"export: {out} is a file, not a folder; give the folder to write the model into")
    parent = out
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"export: cannot create the folder {out}: {parent} is a file; give another folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"export: cannot create or write the folder {out}: {parent} is not writable; give a "
                          "folder that can be written")
    return out


def export_hf(model_or_state_dict: nn.Module | Mapping[str, Any], cfg: LlamaConfig, out_dir: str | os.PathLike[str],
              dtype: torch.dtype | None = torch.bfloat16, *, tokenizer: str | os.PathLike[str] | None = None,
              bos_token_id: int | None = None, eos_token_id: int | list[int] | None = None,
              max_shard_bytes: int = 5 * 1024**3) -> Path | None:
    """Write a Hugging Face Llama folder (``config.json``, ``generation_config.json``, safetensors, and the
    tokenizer files when ``tokenizer`` is given) that ``AutoModelForCausalLM.from_pretrained`` loads.

    ``model_or_state_dict``: a stoker :class:`~stoker.train.model.Llama` (plain, TP- or FSDP-sharded) or its
    state dict (DTensors allowed). ``dtype``: the weights' dtype on disk (``None`` keeps theirs). Every rank
    calls this under ``torch.distributed``; rank 0 writes and gets the folder's path, the others ``None``.
    """
    import torch.distributed as dist

    if tokenizer is not None and not Path(tokenizer).exists():
        raise ConfigError(f"export: tokenizer {tokenizer} does not exist; give a tokenizer.model/tokenizer.json "
                          "file or a folder holding them")
    sd = full_state_dict(model_or_state_dict)
    distributed = dist.is_available() and dist.is_initialized()
    if distributed and dist.get_rank() != 0:
        dist.barrier()
        return None
    try:
        hf_sd = to_hf_state_dict(sd, cfg)
        target_dtype = dtype
        tensors = {k: (v.to(target_dtype) if target_dtype is not None else v).contiguous().clone()
                   for k, v in hf_sd.items()}
        saved_dtype = next(iter(tensors.values())).dtype
        out = check_output_folder(out_dir)
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"export: cannot create the folder {out} ({e.strerror}); give a folder that can be "
                              "written") from None
        for stale in list(out.glob("model*.safetensors")) + list(out.glob("model.safetensors.index.json")):
            stale.unlink()
        files = _save_shards(tensors, out, max_shard_bytes)
        ids = {k: v for k, v in (("bos_token_id", bos_token_id), ("eos_token_id", eos_token_id)) if v is not None}
        dtype_name = str(saved_dtype).removeprefix("torch.")
        hf_cfg = to_hf_config(cfg, **ids, **{_dtype_key(): dtype_name})
        hf_cfg.save_pretrained(str(out))
        _write_generation_config(out, hf_cfg.bos_token_id, hf_cfg.eos_token_id)
        if tokenizer is not None:
            files += _copy_tokenizer(tokenizer, out)
        log.info("exported %s (%s, %d tensors) to %s", files, dtype_name, len(tensors), out)
        return out
    finally:
        if distributed:
            dist.barrier()


def _dtype_key() -> str:
    import transformers

    # transformers 5 renamed config.torch_dtype to config.dtype
    return "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"


def _write_generation_config(out: Path, bos: int | None, eos: int | list[int] | None) -> None:
    import transformers

    kw = {k: v for k, v in (("bos_token_id", bos), ("eos_token_id", eos)) if v is not None}
    transformers.GenerationConfig(**kw).save_pretrained(str(out))


# ------------------------------------------------------------------------------------------- import

def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        sd: dict[str, torch.Tensor] = {}
        for f in files:
            sd.update(load_file(str(folder / f)))
        return sd
    if (folder / "model.safetensors").is_file():
        return load_file(str(folder / "model.safetensors"))
    bins = sorted(folder.glob("pytorch_model*.bin"))
    if bins:
        sd = {}
        for b in bins:
            sd.update(torch.load(b, map_location="cpu", weights_only=True))
        return sd
    raise CheckpointError(f"import: {folder} holds no model.safetensors, sharded safetensors index or "
                          "pytorch_model*.bin; give a Hugging Face model folder")


def load_hf(folder: str | os.PathLike[str],
            dtype: torch.dtype | None = None) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    """Read a Hugging Face Llama folder into a stoker config and state dict (stoker names).

    ``dtype`` casts the weights (default: keep the stored dtype). The state dict loads with
    ``Llama(cfg).load_state_dict(sd)``; for tied embeddings ``output.weight`` is the embedding tensor.
    """
    path = Path(folder)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"import: {cfg_file} not found; give a Hugging Face model folder")
    cfg = from_hf_config(json.loads(cfg_file.read_text()), source=str(cfg_file))
    sd = _read_weights(path)
    if dtype is not None:
        sd = {k: v.to(dtype) for k, v in sd.items()}
    return cfg, from_hf_state_dict(sd, cfg)


def load_hf_into(model: nn.Module, folder: str | os.PathLike[str]) -> None:
    """Load a Hugging Face Llama folder into an existing (unsharded) stoker model, checking the shapes."""
    cfg, sd = load_hf(folder)
    model_cfg = getattr(model, "cfg", None)
    if model_cfg is not None:
        mine = {k: getattr(model_cfg, k) for k in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "ffn_dim")}
        theirs = {k: getattr(cfg, k) for k in mine}
        if mine != theirs:
            raise CheckpointError(f"import: {folder} has shape {theirs}, the model has {mine}")
    model.load_state_dict(sd, strict=True)


# ------------------------------------------------------------------------------ from a checkpoint

_MANIFEST, _LATEST, _STEP = "manifest.json", "latest", "step_"


def source_model_config(source: str | os.PathLike[str]) -> LlamaConfig:
    """The model shape of fine-tuning weights, without loading them: a Hugging Face folder's ``config.json``
    or the model config a stoker checkpoint's manifest records (``init_from`` without a model name)."""
    from stoker.store.objects import open_objects

    url = str(source)
    try:
        config = open_objects(url.rstrip("/"), error=CheckpointError).try_get_bytes("config.json")
        if config is not None:
            return from_hf_config(json.loads(config), source=f"{url}/config.json")
        model = (_unverified_manifest(url).get("fingerprint") or {}).get("model")
    except (OSError, ValueError, CheckpointError) as exc:
        raise ConfigError(f"model.init_from={url}: cannot read its model config ({exc}); give a Hugging Face folder "
                          "(config.json + safetensors) or a stoker checkpoint, or name the model in [model]") from None
    if not model:
        raise ConfigError(f"model.init_from={url}: its manifest records no model config; name the model in [model]")
    return LlamaConfig(**model)


def _unverified_manifest(url: str) -> dict[str, Any]:
    """The manifest of the checkpoint ``url`` names (the step folder, or the first candidate in a checkpoint
    folder whose manifest parses), without hashing its files: enough to learn the model's shape."""
    from stoker.train.checkpoint_files import LATEST, Store, candidates, is_checkpoint, parse_manifest, split

    if is_checkpoint(url):
        base, name = split(url)
        store = Store(base)
        return parse_manifest(store.read_text(name, _MANIFEST), store.url(name, _MANIFEST))
    store = Store(url)
    for name in candidates(store) if store.exists(LATEST) or store.list() else []:
        if store.exists(name, _MANIFEST):
            try:
                return parse_manifest(store.read_text(name, _MANIFEST), store.url(name, _MANIFEST))
            except CheckpointError:
                continue
    raise CheckpointError(f"no committed checkpoint at {url}")


def load_checkpoint_weights(checkpoint: str | os.PathLike[str], *, what: str = "checkpoint"
                            ) -> tuple[LlamaConfig, dict[str, torch.Tensor], dict[str, Any]]:
    """Model config, full model weights (stoker names, CPU) and manifest of a committed stoker checkpoint.

    ``checkpoint``: a ``step_XXXXXXXX`` folder (refused in one line when damaged) or a checkpoint directory
    (its newest valid checkpoint: ``latest``, else the newest that verifies; each skipped one is named in a
    warning), local or an fsspec URL. ``what`` names the reader in messages. Runs in one process: the
    torch.distributed.checkpoint shards of any TP/FSDP layout are read back as full tensors."""
    import torch.distributed.checkpoint as dcp

    from stoker.train.checkpoint_files import ERRORS, Store, describe_failure, find, split
    from stoker.train.checkpoint_objects import ObjectReader

    found, manifest = find(str(checkpoint), what)
    base, name = split(found)
    store = Store(base)
    model_dict = (manifest.get("fingerprint") or {}).get("model")
    if not model_dict:
        raise CheckpointError(f"{what}: {found}/{_MANIFEST} records no model config; not a stoker training checkpoint")
    cfg = LlamaConfig(**model_dict)
    if store.local:
        reader: Any = dcp.FileSystemReader(store.join(name))
    else:  # shards checked against the manifest as they come down
        reader = ObjectReader(store.objects, name, manifest["files"])
    state: dict[str, Any] = {}
    try:  # verified above; this catches what a checksum cannot (a checkpoint another torch cannot read)
        metadata = reader.read_metadata()
        for key, meta in metadata.state_dict_metadata.items():
            if key.startswith("model.") and hasattr(meta, "size"):
                state[key] = torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
        if state:  # no_dist: this process reads every shard itself, whatever the layout that wrote them
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
                dcp.load({"model": {k[len("model."):]: v for k, v in state.items()}},  # type: ignore[arg-type]
                         storage_reader=reader, no_dist=True)
    except ERRORS as e:
        raise CheckpointError(f"{what}: cannot read checkpoint {found}: {describe_failure(e, found)}") from e
    if not state:
        raise CheckpointError(f"{what}: {found} holds no model.* tensors; not a stoker training checkpoint")
    weights = {_clean(k[len("model."):]): v for k, v in state.items()}
    return cfg, weights, manifest


def export_from_checkpoint(checkpoint: str | os.PathLike[str], out_dir: str | os.PathLike[str],
                           dtype: torch.dtype | None = torch.bfloat16, **kwargs: Any) -> Path:
    """Export a committed stoker training checkpoint (any TP/ZeRO-1/FSDP layout) as a Hugging Face folder.

    Run it in a single process (no torchrun needed). ``kwargs`` go to :func:`export_hf` (``tokenizer``,
    ``bos_token_id``, ``eos_token_id``, ``max_shard_bytes``)."""
    check_output_folder(out_dir)  # before the weights are read: a bad target fails in a moment
    cfg, weights, manifest = load_checkpoint_weights(checkpoint, what="export")
    if not cfg.tie_embeddings and "output.weight" not in weights:
        raise CheckpointError(f"export: {checkpoint} lacks output.weight for an untied model")
    out = export_hf(weights, cfg, out_dir, dtype=dtype, **kwargs)
    assert out is not None
    log.info("exported checkpoint step %s to %s", manifest.get("step"), out)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m stoker.train.hf CHECKPOINT OUT_DIR [--dtype bfloat16] [--tokenizer PATH]``."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m stoker.train.hf", description="Export a stoker training "
                                 "checkpoint (a step_* folder or a checkpoint directory) as a Hugging Face model.")
    ap.add_argument("checkpoint")
    ap.add_argument("out_dir")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--tokenizer", default=None, help="tokenizer.model / tokenizer.json, or a folder holding them")
    args = ap.parse_args(argv)
    try:
        out = export_from_checkpoint(args.checkpoint, args.out_dir, dtype=getattr(torch, args.dtype),
                                     tokenizer=args.tokenizer)
    except StokerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # writing the files failed (no space left, ...): one line naming the path
        print(f"error: export to {args.out_dir}: {e.strerror or e}"
              + (f": {e.filename}" if e.filename else ""), file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
