"""Reading a training configuration: a TOML file (stoker's or torchtitan's), ``section.key=value`` overrides and
the short flags, each value type-checked, into a validated :class:`TrainConfig`.

The settings themselves (one dataclass per section, with their help and checks) are defined in
:mod:`stoker.train.settings`; their names are re-exported here for code that imports them from this module.
Like that module, this one imports no torch."""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from stoker.errors import ConfigError
from stoker.train.settings import (  # noqa: F401  (re-exported: their home before stoker.train.settings)
    SCHEDULES,
    SECTIONS,
    CheckpointSection,
    DataSection,
    LlamaConfig,
    MetricsSection,
    ModelSection,
    OptimSection,
    ParallelConfig,
    TrainConfig,
    TrainSection,
    with_overrides,
)

_SECTIONS: dict[str, type] = {k: v for k, v in SECTIONS.items() if k != "model"}  # [model] is read below
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
            raise ConfigError(f"{source}: unknown section or setting {key!r}; "
                              f"valid: out_dir, model, {', '.join(_SECTIONS)}")
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
            raw = tomllib.loads(p.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p}: invalid TOML: {e}") from None
        except UnicodeDecodeError as e:  # a binary file (a checkpoint, an archive) given as the config
            raise ConfigError(f"config file {p} is not text (byte {e.start} is not UTF-8), so not a TOML file: pass "
                              f"--config with the training's TOML file") from None
        except OSError as e:
            raise ConfigError(f"config file {p} cannot be read: {e.strerror or e}; pass --config with a readable "
                              f"TOML file") from None
        source = str(p)
        from stoker.train import torchtitan

        if config_format == "torchtitan" or (config_format == "auto" and torchtitan.is_torchtitan(raw)):
            return from_dict(torchtitan.load(raw, list(overrides or []), source, aliases=ALIASES,
                                             apply_overrides=apply_overrides), source=source)
    elif config_format == "torchtitan":
        raise ConfigError("--config-format torchtitan needs --config FILE (a torchtitan TOML)")
    apply_overrides(raw, list(overrides or []))
    return from_dict(raw, source=source)


def resolve_model(model: ModelSection) -> LlamaConfig:
    """The model's shape: the named one with the overrides or, with ``init_from`` and no name, the source's (a
    Hugging Face folder's config.json or a stoker checkpoint's manifest, read here) with the overrides."""
    if model.init_from and not model.name:
        from stoker.train.hf import source_model_config

        return with_overrides(source_model_config(model.init_from), **model.overrides)
    return model.resolve()


def as_config(cfg: TrainConfig | dict[str, Any]) -> TrainConfig:
    """Accept a :class:`TrainConfig` or its dict form (what flows pass)."""
    return cfg if isinstance(cfg, TrainConfig) else from_dict(cfg)
