"""Run inputs: `Parameter` (CLI `--name value`), `Config` (a TOML/JSON file) and `IncludeFile` (a file's text).

All three are declared as class attributes of a FlowSpec, resolved once by the scheduler, stored with the run,
and read in every step as `self.<attribute>` (read-only).
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from stoker.errors import ConfigError
from stoker.flow.configs import NOT_CONFIG_KEYS, UNPACK_KEY, ConfigValue, DelayEvaluator, delayed_attribute

_MISSING = object()


class JSONTypeClass:
    """`type=JSONType` parses the CLI value as JSON (as Metaflow's JSONType)."""

    name = "JSON"

    def __call__(self, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"not valid JSON: {e}") from None
        return value


JSONType = JSONTypeClass()


def _parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    s = str(value).strip().lower()
    if s in ("1", "true", "yes", "on", "y", "t"):
        return True
    if s in ("0", "false", "no", "off", "n", "f"):
        return False
    raise ValueError(f"{value!r} is not a boolean (use true/false)")


class ParameterContext(NamedTuple):
    """What a callable default receives (Metaflow's ParameterContext)."""

    flow_name: str
    user_name: str
    parameter_name: str
    logger: Callable[..., None] = print
    ds_type: str = "local"
    configs: Any = None


def _call_default(fn: Callable[..., Any], ctx: ParameterContext | None) -> Any:
    try:
        takes_arg = len(inspect.signature(fn).parameters) > 0
    except (TypeError, ValueError):
        takes_arg = False
    return fn(ctx) if takes_arg else fn()


class Parameter:
    """A run parameter, given on the command line as `--name value` (or `--name-with-dashes`).

    `secret=True` keeps its value out of the store and the index (see docs/store.md, "Security")."""

    IS_RUN_INPUT = True

    def __init__(
        self,
        name: str,
        default: Any = _MISSING,
        type: Callable[[Any], Any] | None = None,  # noqa: A002 - Metaflow's argument name
        help: str | None = None,  # noqa: A002
        required: bool = False,
        show_default: bool = True,
        separator: str | None = None,
        secret: bool = False,
        **_ignored: Any,
    ) -> None:
        self.name = name
        self.separator = separator
        # secret: never stored (the run record, the index, manifests, `show` say "***"); the run's tasks get
        # the value in their environment, and read it as usual (`self.<name>`)
        self.secret = bool(secret)
        self.default = default
        self.help = help or ""
        self.required = required
        self.show_default = show_default
        if type is None:
            type = builtins_type(default) if default is not _MISSING and default is not None \
                and not callable(default) else str
        self.type = type

    @property
    def cli_name(self) -> str:
        return self.name.replace("_", "-")

    def convert(self, raw: Any) -> Any:
        if self.separator and isinstance(raw, str):
            return [self._convert_one(v) for v in raw.split(self.separator)]
        return self._convert_one(raw)

    def _convert_one(self, raw: Any) -> Any:
        try:
            if self.type is bool:
                return _parse_bool(raw)
            if raw is None:
                return None
            if self.type in (int, float, str) and isinstance(raw, self.type):
                return raw
            return self.type(raw)
        except (ValueError, TypeError) as e:
            tname = getattr(self.type, "__name__", getattr(self.type, "name", str(self.type)))
            if getattr(self, "secret", False):  # the value (and the error quoting it) is never printed
                raise ConfigError(f"parameter --{self.cli_name} (secret): the value given is not a valid {tname}; "
                                  f"pass a valid {tname}") from None
            raise ConfigError(f"parameter --{self.cli_name}: {raw!r} is not a valid {tname} ({e})") from None

    def resolve(self, given: Any = _MISSING, ctx: ParameterContext | None = None) -> Any:
        """The value for a run: the CLI value, else the default, else an error when required."""
        if given is not _MISSING and given is not None:
            return self.convert(given)
        if self.default is _MISSING:
            if self.required:
                raise ConfigError(f"parameter --{self.cli_name} is required: pass --{self.cli_name} VALUE to run")
            return None
        if callable(self.default) and not isinstance(self.default, type):
            try:
                d = _call_default(self.default, ctx)
            except Exception as e:  # noqa: BLE001 - the user's function
                raise ConfigError(f"the default of parameter --{self.cli_name} raised {type(e).__name__}: {e}; "
                                  f"fix the function or pass --{self.cli_name} VALUE") from None
        else:
            d = self.default
        return self.convert(d) if d is not None else None

    def __repr__(self) -> str:
        return f"Parameter({self.name!r})"


ENV_PREFIXES = ("STOKER_PARAM_", "METAFLOW_RUN_")  # stoker's own prefix wins over Metaflow's


def env_var_names(name: str) -> list[str]:
    """The environment variables that give a parameter's value to `run`: STOKER_PARAM_<NAME> and, as Metaflow's
    click options read them, METAFLOW_RUN_<NAME> (NAME upper-case, dashes as underscores)."""
    key = name.replace("-", "_").upper()
    return [prefix + key for prefix in ENV_PREFIXES]


def parameters_from_env(params: Mapping[str, Any], given: Mapping[str, Any],
                        environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Values of the Parameters not given on the command line (which wins) that the environment sets;
    `params` maps attribute names to run inputs, the result maps parameter names to raw values."""
    env = os.environ if environ is None else environ
    out: dict[str, str] = {}
    for p in params.values():
        if not isinstance(p, Parameter) or given.get(p.name) is not None:
            continue
        for var in env_var_names(p.name):
            if env.get(var):  # as click: an empty variable is no value
                try:
                    p.convert(env[var])
                except ConfigError as e:
                    raise ConfigError(f"{e} (the value comes from ${var}: fix or unset it)") from None
                out[p.name] = env[var]
                break
    return out


def gang_size(num_parallel: Any, params: Mapping[str, Any], values: Mapping[str, Any] | None = None) -> int | None:
    """The size of a gang (`num_parallel=` as the graph read it: a literal, or the source of an expression) as far
    as it is known before its step runs: a literal, `self.PARAM` of a Parameter, whose value is the run's
    (`values`: attribute -> the value as the Parameter converted it), else the Parameter's default as it converts
    it, or `self.CONFIG.key.sub` of a Config in `values` (either may be wrapped in `int(...)`). None when only the
    step can tell (another expression, a default a function computes) and for anything but a positive int.
    `params` maps attribute names to run inputs (`FlowSpec._run_inputs()`)."""
    n = num_parallel
    if isinstance(n, str) and n.startswith("int(") and n.endswith(")"):
        n = n[4:-1].strip()
    if isinstance(n, str) and n.count(".") > 1:  # self.CONFIG.key...: the run's config value, when it is known
        head, *keys = n.removeprefix("self.").split(".")
        if not (n.startswith("self.") and isinstance(params.get(head), Config) and values and head in values):
            return None
        n = values[head]
        for k in keys:
            n = n.get(k) if isinstance(n, Mapping) else None
        n = n if not isinstance(n, float) or not n.is_integer() else int(n)
    if isinstance(n, str):
        attr = n.removeprefix("self.") if n.startswith("self.") else ""
        p = params.get(attr) if attr.isidentifier() else None
        if not isinstance(p, Parameter):
            return None
        if values is not None and attr in values:
            n = values[attr]
        elif p.default is _MISSING or p.default is None or (callable(p.default) and not isinstance(p.default, type)):
            return None
        else:
            n = p.convert(p.default)
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def builtins_type(value: Any) -> Callable[[Any], Any]:
    if isinstance(value, bool):
        return bool
    if isinstance(value, int):
        return int
    if isinstance(value, float):
        return float
    if isinstance(value, (dict, list)):
        return JSONType
    return str


def load_config_file(path: str | os.PathLike) -> dict:
    """Parse a TOML or JSON file, naming the file and the fix on error."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist: pass an existing TOML or JSON file")
    try:
        return parse_config_text(p.read_text(), json_format=p.suffix == ".json")
    except Exception as e:  # noqa: BLE001 - any parse error is the user's file
        raise ConfigError(f"config file {p} cannot be parsed: {e}") from None


def parse_config_text(text: str, json_format: bool | None = None) -> dict:
    """TOML or JSON text (JSON when ``json_format``, or when None and it starts with ``{``) as a dict."""
    if json_format or (json_format is None and text.lstrip().startswith("{")):
        return json.loads(text)
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    return tomllib.loads(text)


def parse_override_value(text: str) -> Any:
    """`--set a.b=VALUE`: VALUE as JSON/TOML scalar when it parses, else the raw string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        low = text.lower()
        if low in ("true", "false"):
            return low == "true"
        return text


def apply_overrides(data: dict, overrides: Mapping[str, Any], source: str = "--set") -> dict:
    """Return a copy of `data` with dotted keys set; an unknown top-level section is an error."""
    out = json.loads(json.dumps(data))
    for dotted, value in overrides.items():
        keys = dotted.split(".")
        cur = out
        for k in keys[:-1]:
            if k not in cur or not isinstance(cur[k], dict):
                if cur is out and out:
                    raise ConfigError(
                        f"{source} {dotted}: there is no section {k!r} in the config (sections: {sorted(out)})"
                    )
                cur[k] = {}
            cur = cur[k]
        cur[keys[-1]] = value
    return out


class ConfigText(str):
    """A Config's value given as its text (`--config-value NAME VALUE`, $METAFLOW_FLOW_CONFIG_VALUE), not a file's
    path: parsed as the config's default text would be (JSON, or the config's parser), as Metaflow does."""


class Config:
    """A configuration file (TOML or JSON) stored with the run: `Config("config", default="cfg.toml")`.

    `--config PATH` (or `--config NAME PATH` when a flow has several) chooses the file, `--set key.sub=value`
    overrides single values. Read it in steps as `self.config.section.key` or `self.config["section"]`.
    """

    IS_CONFIG = True  # flow/configs.py tells a Config from a Parameter by this (it does not import us)

    IS_RUN_INPUT = True

    def __init__(
        self,
        name: str,
        default: str | os.PathLike | None = None,
        default_value: Mapping | None = None,
        help: str | None = None,  # noqa: A002
        required: bool = False,
        parser: Callable[[str], dict] | str | None = None,
        **_ignored: Any,
    ) -> None:
        self.name = name
        if default is not None and default_value is not None:
            raise ConfigError(f"config {name!r}: give default (a file) or default_value (a value), not both")
        self.default = default  # a path, or a function of the ParameterContext that returns one
        # a dict, the config's text, or a function of the ParameterContext that returns either
        self.default_value = dict(default_value) if isinstance(default_value, Mapping) else default_value
        self.help = help or ""
        self.required = required
        self.parser = parser

    def resolve(self, path: str | None = None, overrides: Mapping[str, Any] | None = None,
                base_dir: Path | None = None, ctx: ParameterContext | None = None) -> ConfigValue | None:
        """The run's value: the file given, else the default file, else the default value (each default may be a
        function of the context, which, as in Metaflow, has no `configs`); overrides applied."""
        if isinstance(path, ConfigText):  # the value itself, in place of the file or the defaults
            src, default_value = None, str(path)
        else:
            src = path or self._default_of("default", self.default, ctx)
            default_value = None if src is not None else self._default_of("default_value", self.default_value, ctx)
        if src is not None:
            p = Path(src)
            if not p.is_absolute() and base_dir is not None and not p.exists():
                p = base_dir / p
            if self.parser and not p.is_file():
                raise ConfigError(f"config file {p} does not exist: pass an existing TOML or JSON file")
            data = self._parse(p.read_text()) if self.parser else load_config_file(p)
        elif isinstance(default_value, Mapping):
            data = dict(default_value)
        elif isinstance(default_value, (str, bytes)):  # the config's text, parsed as a file's would be
            text = default_value.decode() if isinstance(default_value, bytes) else default_value
            try:
                data = self._parse(text) if self.parser else parse_config_text(text, json_format=True)
            except ConfigError:
                raise
            except Exception as e:  # noqa: BLE001 - the user's text
                what = "the value given" if isinstance(path, ConfigText) else "its default value"
                raise ConfigError(f"config {self.name!r}: {what} cannot be parsed: {e}") from None
        elif default_value is not None:
            raise ConfigError(f"config {self.name!r}: default_value must be a dict or the config's text, got "
                              f"{type(default_value).__name__}")
        elif self.required:
            raise ConfigError(f"config {self.name!r} is required: pass --config {self.name} PATH")
        else:
            data = {}
        return ConfigValue(apply_overrides(data, overrides or {}))

    def _parse(self, text: str) -> Any:
        """The parser's dict of `text`; a parser named by a dotted string (`parser="tomllib.loads"`, as Metaflow
        allows) is imported first."""
        parser = self.parser
        if isinstance(parser, str):
            module, _, attr = parser.rpartition(".")
            if not module or module.startswith(".") or parser.startswith("."):
                raise ConfigError(f"config {self.name!r}: parser {parser!r} must be 'module.function' (a "
                                  f"Metaflow-internal '.name' parser has no stoker twin)")
            try:
                parser = getattr(importlib.import_module(module), attr, None)
            except ImportError as e:
                raise ConfigError(f"config {self.name!r}: cannot import the parser's module {module!r} ({e}); "
                                  f"install it or pass a function") from None
            if not callable(parser):
                raise ConfigError(f"config {self.name!r}: {attr!r} of {module} is not a function; fix parser=")
        data = parser(text)
        if not isinstance(data, Mapping):
            raise ConfigError(f"config {self.name!r}: the parser returned a {type(data).__name__}, not a mapping; "
                              f"make it return a dict")
        return data

    def _default_of(self, what: str, value: Any, ctx: ParameterContext | None) -> Any:
        if not callable(value) or isinstance(value, type):
            return value
        ctx = (ctx or ParameterContext(flow_name="", user_name=os.environ.get("USER", ""),
                                       parameter_name=self.name))._replace(parameter_name=self.name, configs=None)
        try:
            return _call_default(value, ctx)
        except Exception as e:  # noqa: BLE001 - the user's function
            raise ConfigError(f"the {what} function of config {self.name!r} raised {type(e).__name__}: {e}; fix "
                              f"the function or pass --config {self.name} PATH") from None

    def __repr__(self) -> str:
        return f"Config({self.name!r})"

    # A Config used at class-body time, as in Metaflow: `@retry(times=cfg.retries)`, `cfg["a"]`, `**cfg`; each
    # is a config expression, evaluated when the run's values are known (flow/configs.py).
    secret = False  # attributes the rest of stoker reads on run inputs (never config expressions)
    separator = None
    show_default = True

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_") or key in NOT_CONFIG_KEYS:
            raise AttributeError(key)

        return delayed_attribute(self.__dict__.get("name", ""), key)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str) and key.startswith(UNPACK_KEY):
            return DelayEvaluator(self.name)
        return DelayEvaluator(self.name)[key]

    def keys(self) -> list[str]:
        """`**cfg` in a decorator: the whole config's keys become its arguments (when the run starts)."""
        return [f"{UNPACK_KEY}{id(self)}"]


class IncludeFile(Parameter):
    """A file whose contents become an artifact: `IncludeFile("data", default="data.csv", is_text=True)`."""

    def __init__(self, name: str, default: Any = _MISSING, is_text: bool = True, encoding: str = "utf-8",
                 help: str | None = None, required: bool = False, **kw: Any) -> None:  # noqa: A002
        super().__init__(name, default=default, type=str, help=help, required=required, **kw)
        self.is_text = is_text
        self.encoding = encoding

    def resolve(self, given: Any = _MISSING, ctx: ParameterContext | None = None) -> Any:
        path = super().resolve(given, ctx)
        if path is None:
            return None
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"--{self.cli_name} {path}: no such file; pass the path of an existing file")
        return p.read_text(encoding=self.encoding) if self.is_text else p.read_bytes()
