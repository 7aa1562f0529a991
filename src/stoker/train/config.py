"""Trainer configuration: dataclasses loadable from TOML, overridable with ``section.key=value``."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from stoker.errors import ConfigError
from stoker.train.configs import get_model_config, with_overrides
from stoker.train.model import LlamaConfig
from stoker.train.parallel import ParallelConfig

SCHEDULES = ("cosine", "linear", "constant")


@dataclass(kw_only=True)
class ModelSection:
    """``[model]``: a named config plus any :class:`LlamaConfig` field to override (``max_seq_len = 256``).
    Without a name the shape is ``init_from``'s (a Hugging Face folder's config.json or a stoker
    checkpoint's manifest), else ``tiny``."""

    name: str = ""
    overrides: dict[str, Any] = field(default_factory=dict)
    init_from: str = ""  # start from these weights: a Hugging Face folder or a stoker checkpoint (fine-tuning)

    def __post_init__(self) -> None:
        if not self.name and not self.init_from:
            self.name = "tiny"
        self.resolve()  # validates the name and the overrides now

    def resolve(self) -> LlamaConfig:
        if self.init_from and not self.name:
            from stoker.train.hf import source_model_config

            return with_overrides(source_model_config(self.init_from), **self.overrides)
        return get_model_config(self.name, **self.overrides)


@dataclass(kw_only=True)
class DataSection:
    """``[data]``: ``url`` of a prepared ``stoker.data`` dataset or a flat token file (``.bin``/``.npy``)."""

    url: str = ""
    split: str = "train"
    shuffle: bool = True
    block_size: int = 0  # token files only: tokens per sample incl. the shifted target (0: max_seq_len + 1)
    token_dtype: str = "uint16"  # token files (.bin) only

    def __post_init__(self) -> None:
        if self.block_size < 0:
            raise ConfigError(f"data.block_size must be >= 0, got {self.block_size}")


@dataclass(kw_only=True)
class OptimSection:
    """``[train]``: steps, batch, optimizer, schedule, clipping, seed, logging."""

    steps: int = 100
    micro_batch_size: int = 8
    global_batch_size: int = 0  # sequences per optimizer step; 0: micro_batch_size x dp (no accumulation)
    lr: float = 3e-4
    min_lr: float = 0.0
    warmup_steps: int = 0
    schedule: str = "cosine"
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    seed: int = 0
    log_every: int = 10
    accelerator: str = "auto"
    stop_after: int = 0  # stop (with a checkpoint) once this step is reached; 0: run all steps

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ConfigError(f"train.steps must be >= 1, got {self.steps}")
        if self.micro_batch_size < 1:
            raise ConfigError(f"train.micro_batch_size must be >= 1, got {self.micro_batch_size}")
        if self.global_batch_size < 0:
            raise ConfigError(f"train.global_batch_size must be >= 0, got {self.global_batch_size}")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"train.schedule={self.schedule!r}; use one of {SCHEDULES}")
        if self.lr <= 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise ConfigError(f"need 0 <= train.min_lr <= train.lr and lr > 0 (lr={self.lr}, min_lr={self.min_lr})")
        if self.stop_after < 0:
            raise ConfigError(f"train.stop_after must be >= 0, got {self.stop_after}")
        if self.warmup_steps < 0 or self.log_every < 1:
            raise ConfigError("train.warmup_steps must be >= 0 and train.log_every >= 1")


@dataclass(kw_only=True)
class CheckpointSection:
    """``[checkpoint]``: where and how often; ``resume`` = ``auto`` (latest in ``dir`` if any) or ``never``."""

    dir: str = ""  # default: <out_dir>/checkpoints; a local path or an fsspec URL
    every: int = 0  # steps between checkpoints (0: only at the end)
    keep: int = 3
    async_save: bool = False
    save_final: bool = True
    resume: str = "auto"
    resume_from: str = ""  # a checkpoint (step_XXXXXXXX folder) or a checkpoint dir (its latest)

    def __post_init__(self) -> None:
        if self.resume not in ("auto", "never"):
            raise ConfigError(f"checkpoint.resume={self.resume!r}; use 'auto' or 'never'")
        if self.every < 0 or self.keep < 1:
            raise ConfigError("checkpoint.every must be >= 0 and checkpoint.keep >= 1")


@dataclass(kw_only=True)
class MetricsSection:
    """``[metrics]``: JSON lines file, TensorBoard (when installed), rich progress on rank 0."""

    path: str = ""  # default: <out_dir>/metrics.jsonl
    tensorboard: bool = True
    progress: bool = True


@dataclass(kw_only=True)
class TrainConfig:
    """The whole training configuration (``stoker.train``'s TOML file)."""

    out_dir: str = "stoker-train"
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    train: OptimSection = field(default_factory=OptimSection)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    metrics: MetricsSection = field(default_factory=MetricsSection)

    @property
    def checkpoint_dir(self) -> str:
        return self.checkpoint.dir or str(Path(self.out_dir) / "checkpoints")

    @property
    def metrics_path(self) -> str:
        return self.metrics.path or str(Path(self.out_dir) / "metrics.jsonl")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


_SECTIONS: dict[str, type] = {
    "data": DataSection, "train": OptimSection, "parallel": ParallelConfig,
    "checkpoint": CheckpointSection, "metrics": MetricsSection,
}
# short top-level flags that flows and users pass (``--data URL --steps 200``)
ALIASES = {
    "data": "data.url", "model": "model.name", "steps": "train.steps", "lr": "train.lr", "seed": "train.seed",
    "tp": "parallel.tp", "dp_mode": "parallel.dp_mode", "checkpoint_dir": "checkpoint.dir",
    "resume_from": "checkpoint.resume_from", "micro_batch_size": "train.micro_batch_size",
    "global_batch_size": "train.global_batch_size",
}


_TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "a table"}


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _expected_type(key: str) -> Any:
    """The declared type of a dotted setting (``train.steps`` -> int), or None when unknown."""
    parts = key.split(".")
    if parts == ["out_dir"]:
        return str
    if len(parts) != 2:
        return None
    section, name = parts
    if section == "model":
        if name in ("name", "init_from"):
            return str
        return _field_types(LlamaConfig).get(name)
    cls = _SECTIONS.get(section)
    return _field_types(cls).get(name) if cls is not None else None


def _check_type(key: str, value: Any, expected: Any, source: str) -> Any:
    """``value`` as the declared type, or a :class:`ConfigError` naming the key, the value and the type."""
    if expected is None or expected is Any:
        return value
    origin = typing.get_origin(expected)
    if origin in (typing.Union, types.UnionType):  # e.g. dict[str, Any] | None
        options = [a for a in typing.get_args(expected) if a is not type(None)]
        if value is None:
            return value
        return _check_type(key, value, options[0] if len(options) == 1 else None, source)
    base = origin or expected
    ok = False
    if base is bool:
        ok = isinstance(value, bool)
    elif base is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif base is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif base in (str, dict):
        ok = isinstance(value, base)
    else:
        return value
    if not ok:
        where = "" if source == "overrides" else f" (in {source})"
        raise ConfigError(f"{key}={value!r}: expected {_TYPE_WORDS[base]}{where}")
    return value


def _check_section(section: str, cls: type, values: dict[str, Any], source: str) -> dict[str, Any]:
    hints = _field_types(cls)
    return {k: _check_type(f"{section}.{k}", v, hints.get(k), source) for k, v in values.items()}


def from_dict(raw: dict[str, Any], *, source: str = "config") -> TrainConfig:
    """Build a validated :class:`TrainConfig` from nested dicts (TOML layout).

    Every value is checked against its declared type first, so ``train.steps='abc'`` fails with one
    message naming the setting, the value and the expected type."""
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    for key in list(raw):  # flat aliases: {"data": url, "steps": 200, "checkpoint_dir": ...}
        if key in ALIASES and not isinstance(raw[key], dict) and not dataclasses.is_dataclass(raw[key]):
            section, name = ALIASES[key].split(".")
            value = raw.pop(key)
            target = raw.setdefault(section, {})
            if not isinstance(target, dict):
                raise ConfigError(f"{source}: {key!r} and [{section}] given as an object; use one form")
            target[name] = value
    kwargs: dict[str, Any] = {}
    if "out_dir" in raw:
        kwargs["out_dir"] = _check_type("out_dir", raw.pop("out_dir"), str, source)
    model = raw.pop("model", {}) or {}
    if isinstance(model, ModelSection):
        kwargs["model"] = model
    else:
        if not isinstance(model, dict):
            raise ConfigError(f"model={model!r}: expected a table ([model] with name = ... or its settings)"
                              + ("" if source == "overrides" else f" (in {source})"))
        model = dict(model)
        overrides = dict(_check_type("model.overrides", model.pop("overrides", {}) or {}, dict, source))
        overrides.update(model)
        name = _check_type("model.name", overrides.pop("name", ""), str, source)
        init_from = _check_type("model.init_from", overrides.pop("init_from", ""), str, source)
        hints = _field_types(LlamaConfig)
        overrides = {k: _check_type(f"model.{k}", v, hints.get(k), source) for k, v in overrides.items()}
        kwargs["model"] = ModelSection(name=name, overrides=overrides, init_from=init_from)
    for key, value in raw.items():
        cls = _SECTIONS.get(key)
        if cls is None:
            raise ConfigError(f"{source}: unknown section or setting {key!r}; valid: out_dir, model, {', '.join(_SECTIONS)}")
        if dataclasses.is_dataclass(value):
            kwargs[key] = value
            continue
        if not isinstance(value, dict):
            raise ConfigError(f"{key}={value!r}: expected a table ([{key}] with its settings)"
                              + ("" if source == "overrides" else f" (in {source})"))
        valid = {f.name for f in dataclasses.fields(cls)}
        unknown = set(value) - valid
        if unknown:
            raise ConfigError(f"{source}: unknown setting(s) {sorted(f'{key}.{u}' for u in unknown)}; "
                              f"valid in [{key}]: {sorted(valid)}")
        value = _check_section(key, cls, value, source)
        try:
            kwargs[key] = cls(**value)
        except TypeError as e:
            raise ConfigError(f"{source}: [{key}] {e}") from None
    return TrainConfig(**kwargs)


def _parse_value(text: str, expected: Any = None) -> Any:
    if expected is str and not text.startswith(("'", '"')):
        return text  # a string setting keeps its text as given (``--checkpoint-dir 2024``, ``--data 1e3``)
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # a bare string (paths, URLs, names)


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` strings (values parsed as TOML, else taken as strings)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.key=value (e.g. train.lr=3e-4)")
        key, text = item.split("=", 1)
        key = key.strip().replace("-", "_")
        key = ALIASES.get(key, key)
        parts = key.split(".")
        if len(parts) == 1 and parts[0] != "out_dir":
            raise ConfigError(f"override {item!r}: give section.key (e.g. train.{key}) or one of {sorted(ALIASES)}")
        node = raw
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
        node[parts[-1]] = _parse_value(text.strip(), _expected_type(key))
    return raw


CONFIG_FORMATS = ("auto", "stoker", "torchtitan")


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, *,
                config_format: str = "auto") -> TrainConfig:
    """Read a TOML file (optional), apply overrides, validate.

    ``config_format``: ``stoker``, ``torchtitan`` (a torchtitan JobConfig TOML, see
    :mod:`stoker.train.torchtitan`) or ``auto`` (torchtitan when the file has its sections, e.g. ``[training]``)."""
    if config_format not in CONFIG_FORMATS:
        raise ConfigError(f"--config-format {config_format!r}: use one of {CONFIG_FORMATS}")
    raw: dict[str, Any] = {}
    source = "overrides"
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} not found; pass --config with an existing TOML file")
        try:
            raw = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p}: invalid TOML: {e}") from None
        source = str(p)
        from stoker.train import torchtitan

        if config_format == "torchtitan" or (config_format == "auto" and torchtitan.is_torchtitan(raw)):
            return from_dict(torchtitan.load(raw, list(overrides or []), source, aliases=ALIASES,
                                             apply_overrides=apply_overrides), source=source)
    elif config_format == "torchtitan":
        raise ConfigError("--config-format torchtitan needs --config FILE (a torchtitan TOML)")
    apply_overrides(raw, list(overrides or []))
    return from_dict(raw, source=source)


def as_config(cfg: TrainConfig | dict[str, Any]) -> TrainConfig:
    """Accept a :class:`TrainConfig` or its dict form (what flows pass)."""
    return cfg if isinstance(cfg, TrainConfig) else from_dict(cfg)
