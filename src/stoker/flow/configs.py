"""Config values in decorators: `config_expr("cfg.a.b")`, `cfg.a` and `**cfg` at class-body time (as Metaflow).

A decorator argument such as `@retry(times=cfg.retries)` or `@project(name=config_expr("cfg.project"))` is a
`DelayEvaluator`: it is evaluated when the run's Config values are known (`bind_configs`, called when a run
starts and in every task), and only then is the decorator checked. The expression is evaluated as Python with
each Config's *name* bound to its value (a ConfigValue) and the globals of the module that wrote it.
"""

from __future__ import annotations

import collections.abc
import inspect
import json
import re
from collections.abc import Iterator
from typing import Any

from stoker.errors import ConfigError

ID_PATTERN = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
UNPACK_KEY = "_unpacked_delayed_"


class ConfigValue(dict):
    """A read-only dict with attribute access (`self.config.train.lr`), as Metaflow's ConfigValue: nested mappings
    (also inside lists) are ConfigValues, so `cfg["train"].lr` works too, and any change raises TypeError."""

    def __init__(self, data: Any = ()) -> None:
        dict.__init__(self, {k: _construct(v) for k, v in dict(data).items()})

    def __getattr__(self, key: str) -> Any:
        if key.startswith("__"):
            raise AttributeError(key)
        try:
            return self[key]
        except KeyError:
            raise AttributeError(f"config has no key {key!r}; keys: {sorted(self)}") from None

    def _immutable(self, *_args: Any, **_kw: Any) -> Any:
        raise TypeError("ConfigValue is immutable: a Config is read-only in a step; change it with --config or "
                        "--set (or copy it with .to_dict())")

    __setattr__ = __delattr__ = __setitem__ = __delitem__ = _immutable
    clear = update = setdefault = pop = popitem = __ior__ = _immutable  # type: ignore[assignment]

    def to_dict(self) -> dict:
        """A plain (mutable) copy: dicts and lists all the way down."""
        return json.loads(json.dumps(self))

    def copy(self) -> ConfigValue:
        return ConfigValue(self)

    def __reduce__(self):  # rebuilt from plain data when unpickled
        return (ConfigValue, (_to_plain(self),))


def _construct(v: Any) -> Any:
    if isinstance(v, ConfigValue):
        return v
    if isinstance(v, collections.abc.Mapping):
        return ConfigValue(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_construct(x) for x in v)
    return v


# attributes stoker probes on class attributes to find steps: never config keys
NOT_CONFIG_KEYS = frozenset({"is_step", "decorators", "decorator_errors"})

# the flow class whose configs are bound, and {config name: value}
_bound: dict[str, Any] = {"flow": None, "values": None}


class DelayEvaluator(collections.abc.Mapping):
    """An expression over Config values, evaluated when the run's configs are known.

    `obj.x.y` and `obj["x"]` extend the expression (when it is a plain name); `**obj` unpacks it into a
    decorator's arguments (the keys of the config become the arguments)."""

    def __init__(self, expr: str, saved_globals: dict[str, Any] | None = None) -> None:
        self._config_expr = expr
        self._globals = saved_globals
        self._access: list[Any] | None = [] if ID_PATTERN.match(expr) else None

    def __copy__(self) -> DelayEvaluator:
        c = DelayEvaluator(self._config_expr, self._globals)
        c._access = list(self._access) if self._access is not None else None
        return c

    def __deepcopy__(self, memo: dict) -> DelayEvaluator:
        return self.__copy__()

    def _extend(self, key: Any) -> DelayEvaluator:
        c = self.__copy__()
        c._access.append(key)  # type: ignore[union-attr]
        return c

    def __iter__(self) -> Iterator[str]:
        yield f"{UNPACK_KEY}{id(self)}"

    def __len__(self) -> int:
        return 1

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str) and key == f"{UNPACK_KEY}{id(self)}":
            return self
        if self._access is None:
            raise KeyError(key)
        return self._extend(key)

    def __getattr__(self, name: str) -> DelayEvaluator:
        if name.startswith("__") or name in NOT_CONFIG_KEYS or self.__dict__.get("_access") is None:
            raise AttributeError(name)
        return self._extend(name)

    @property
    def expression(self) -> str:
        """The Python expression evaluated (`cfg.train.lr`)."""
        if self._access is None:
            return self._config_expr
        parts = [self._config_expr]
        for a in self._access:
            if isinstance(a, DelayEvaluator):
                parts.append(str(a()))
            elif isinstance(a, str):
                parts.append(a)
            else:
                raise ConfigError(f"config expression {self._config_expr}[{a!r}]: only string keys can be used; "
                                  f"write config_expr(\"...\") for anything else")
        return ".".join(parts)

    def __repr__(self) -> str:
        return f"config_expr({self.expression!r})" if self._access is None or all(
            isinstance(a, str) for a in self._access) else f"config_expr({self._config_expr!r}...)"

    def __call__(self, ctx: Any = None, deploy_time: bool = False) -> Any:
        values = _bound["values"]
        if values is None:
            raise ConfigError(f"{self!r} is evaluated when a run starts, from the flow's Config values; "
                              f"use it in the FlowSpec that defines the Config (or its decorators)")
        expr = self.expression
        try:
            return eval(expr, self._globals or {}, dict(values))  # noqa: S307 - the flow author's expression
        except NameError as e:
            raise ConfigError(f"config expression {expr!r} could not be evaluated: {e}; the flow's configs "
                              f"are {', '.join(sorted(values)) or 'none'}") from None
        except Exception as e:  # noqa: BLE001 - the author's expression: name it and what went wrong
            raise ConfigError(f"config expression {expr!r} failed: {type(e).__name__}: {e}") from None


def config_expr(expr: str) -> DelayEvaluator:
    """An expression over the flow's Configs, for places a Config is not directly reachable (a flow decorator)
    or more than an attribute path: `@project(name=config_expr("cfg.project"))`,
    `@environment(vars={"MODE": config_expr("cfg.mode.upper()")})`. Functions of the calling module can be used
    in it."""
    frame = inspect.currentframe()
    parent = frame.f_back.f_globals if frame is not None and frame.f_back is not None else None
    return DelayEvaluator(expr, saved_globals=parent)


def _to_plain(v: Any) -> Any:
    if isinstance(v, collections.abc.Mapping):
        return {k: _to_plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(_to_plain(x) for x in v)
    return v


def has_delayed(v: Any) -> bool:
    """Whether `v` (an argument value, or a dict/list of them) holds a config expression."""
    if isinstance(v, DelayEvaluator):
        return True
    if isinstance(v, dict):
        return any(has_delayed(k) or has_delayed(x) or (isinstance(k, str) and k.startswith(UNPACK_KEY))
                   for k, x in v.items())
    if isinstance(v, (list, tuple, set)):
        return any(has_delayed(x) for x in v)
    return False


def resolve_delayed(v: Any) -> Any:
    """`v` with every config expression replaced by its value (ConfigValues as plain dicts)."""
    if isinstance(v, DelayEvaluator):
        return _to_plain(v())
    if isinstance(v, dict):
        return {resolve_delayed(k): resolve_delayed(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set)):
        return type(v)(resolve_delayed(x) for x in v)
    return v


def unpack_delayed(attributes: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """`@deco(**cfg.section)`: the unpacked config's keys become arguments (later ones win, as in Metaflow)."""
    out: dict[str, Any] = {}
    new_keys: list[str] = []
    for k, v in attributes.items():
        if isinstance(k, str) and k.startswith(UNPACK_KEY):
            value = resolve_delayed(v)
            if not isinstance(value, dict):
                raise ConfigError(f"**{v!r} in a decorator must unpack a mapping, got {type(value).__name__}")
            new_keys.extend(value)
            out.update(value)
        else:
            out[k] = v
    return out, new_keys


def config_values_by_name(flow_cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """{Config name: value} of a run's resolved inputs (keyed by attribute)."""
    return {p.name: ConfigValue(values[attr]) if type(values[attr]) is dict else values[attr]
            for attr, p in flow_cls._run_inputs().items() if getattr(p, "IS_CONFIG", False) and attr in values}


def flow_decorators(flow_cls: type) -> list[Any]:
    """The flow-level decorators (`@project`, ...) of a flow class."""
    return list(getattr(flow_cls, "_stoker_flow_decorators", ()))


def bind_configs(flow_cls: type, values: dict[str, Any]) -> None:
    """Evaluate every config expression in the decorators of `flow_cls` with the run's Config values (keyed
    by attribute, as resolved for the run), then check those decorators. Idempotent; a later call rebinds."""
    _bound["flow"], _bound["values"] = flow_cls, config_values_by_name(flow_cls, values)
    for deco in flow_decorators(flow_cls):
        deco.resolve_configs()
    for attr in dir(flow_cls):
        func = getattr(flow_cls, attr, None)
        if callable(func) and getattr(func, "is_step", False):
            for deco in getattr(func, "decorators", []):
                resolve = getattr(deco, "resolve_configs", None)
                if resolve is not None:
                    resolve()


def needs_binding(flow_cls: type) -> bool:
    """Whether any decorator of `flow_cls` waits for config values."""
    decos = flow_decorators(flow_cls)
    for attr in dir(flow_cls):
        func = getattr(flow_cls, attr, None)
        if callable(func) and getattr(func, "is_step", False):
            decos.extend(getattr(func, "decorators", []))
    return any(getattr(d, "delayed", False) for d in decos)


def delayed_attribute(config_name: str, key: str) -> DelayEvaluator:
    """`cfg.key` written at class-body time (Config.__getattr__)."""
    return getattr(DelayEvaluator(config_name), key)


__all__ = ["DelayEvaluator", "config_expr", "bind_configs", "resolve_delayed", "unpack_delayed", "has_delayed"]
