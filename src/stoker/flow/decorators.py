"""`@step` and the step decorators: @retry, @catch, @timeout, @resources, @environment, @parallel, @torchrun.

A decorator only records settings on the step function; the scheduler and the task entrypoint read them.
They can also be attached from the CLI: `run --with retry:times=2 --with resources:cpu=2`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..errors import ConfigError
from ..redact import REDACTED
from .configs import UNPACK_KEY, has_delayed, resolve_delayed, unpack_delayed


class StepDecorator:
    """Base of step decorators: `name`, `defaults` and the resolved `attributes`."""

    name = ""
    defaults: dict[str, Any] = {}
    allow_multiple = False

    def __init__(self, attributes: dict[str, Any] | None = None, statically_defined: bool = True) -> None:
        attributes = dict(attributes or {})
        self._check_known(attributes)
        self.statically_defined = statically_defined
        # arguments given (Metaflow's _user_defined_attributes); `**cfg` adds its keys when it is resolved
        self.user_defined = {k for k in attributes if not k.startswith(UNPACK_KEY)}
        self.delayed = has_delayed(attributes)  # config values in the arguments: checked once they are known
        self._raw = attributes
        self.attributes = {**self.defaults, **attributes}
        if not self.delayed:
            self.validate()

    def _check_known(self, attributes: dict[str, Any]) -> None:
        unknown = {k for k in attributes if k not in self.defaults and not str(k).startswith(UNPACK_KEY)}
        if unknown:
            raise ConfigError(
                f"@{self.name} has no argument {', '.join(sorted(unknown))}; "
                f"it takes {', '.join(sorted(self.defaults)) or 'no arguments'}"
            )

    def resolve_configs(self) -> None:
        """Evaluate the config expressions in the arguments (`cfg.x`, `config_expr(...)`, `**cfg`) with the
        run's Config values (flow.configs.bind_configs), then check the arguments."""
        if not self.delayed:
            return
        attributes, new_keys = unpack_delayed(self._raw)
        attributes = resolve_delayed(attributes)
        self._check_known(attributes)
        self.user_defined = self.user_defined | set(new_keys)
        self.attributes = {**self.defaults, **attributes}
        self.validate()
        self._resolved = True

    def validate(self) -> None:
        """Check attribute values; raise ConfigError naming the setting and the fix."""

    def __repr__(self) -> str:
        args = [f"{k}={v!r}" for k, v in self.attributes.items()
                if not str(k).startswith(UNPACK_KEY) and v != self.defaults.get(k)]
        return f"@{self.name}({', '.join(args + self._unpacked())})"

    def _unpacked(self) -> list[str]:
        """`**cfg.x` arguments not yet resolved, as written."""
        if not self.delayed or getattr(self, "_resolved", False):
            return []
        return [f"**{v!r}" for k, v in self._raw.items() if str(k).startswith(UNPACK_KEY)]

    def _number(self, key: str, minimum: float = 0, kind: type = int) -> None:
        v = self.attributes[key]
        try:
            v = kind(v)
        except (TypeError, ValueError):
            raise ConfigError(f"@{self.name}({key}={v!r}): must be a number") from None
        if v < minimum:
            raise ConfigError(f"@{self.name}({key}={v}): must be at least {minimum}")
        self.attributes[key] = v


class RetryDecorator(StepDecorator):
    name = "retry"
    defaults = {"times": 3, "minutes_between_retries": 2}

    def validate(self) -> None:
        self._number("times")
        self._number("minutes_between_retries", kind=float)


class CatchDecorator(StepDecorator):
    name = "catch"
    defaults = {"var": None, "print_exception": True}


class TimeoutDecorator(StepDecorator):
    name = "timeout"
    defaults = {"seconds": 0, "minutes": 0, "hours": 0}

    def validate(self) -> None:
        for k in self.defaults:
            self._number(k, kind=float)
        if self.total_seconds <= 0:
            raise ConfigError("@timeout needs seconds=, minutes= or hours= greater than 0")

    @property
    def total_seconds(self) -> float:
        a = self.attributes
        return a["seconds"] + 60 * a["minutes"] + 3600 * a["hours"]


class ResourcesDecorator(StepDecorator):
    """Per-node resources. Locally they bound concurrency; remote backends request them."""

    name = "resources"
    defaults = {"cpu": None, "memory": None, "gpu": None, "trainium": None, "inferentia": None,
                "efa": None, "shared_memory": None, "disk": None}

    def validate(self) -> None:
        for k, v in self.attributes.items():
            if v is not None:
                self._number(k, kind=float)


class EnvironmentDecorator(StepDecorator):
    name = "environment"
    defaults = {"vars": {}}

    def validate(self) -> None:
        if not isinstance(self.attributes["vars"], dict):
            raise ConfigError("@environment(vars=...) takes a dict of environment variables")
        self.attributes["vars"] = {str(k): str(v) for k, v in self.attributes["vars"].items()}

    def __repr__(self) -> str:  # printed by `show`: the names of the variables, never their values
        names = self.attributes["vars"] if isinstance(self.attributes["vars"], dict) else {}
        return f"@environment({', '.join([f'vars={ {k: REDACTED for k in names} !r}', *self._unpacked()])})"


class ParallelDecorator(StepDecorator):
    """Marks a gang step (the target of `self.next(..., num_parallel=N)`)."""

    name = "parallel"
    defaults = {}


class TorchrunDecorator(ParallelDecorator):
    """A gang step whose nodes launch torchrun: `current.torch.run(entrypoint, args)` in the step."""

    name = "torchrun"
    defaults = {"nproc_per_node": None, "master_port": None, "all_nodes_started_timeout": 600,
                "rdzv_timeout": None, "max_restarts": 0, "tee": True,
                # Neuron: the compile cache's prefix in the store (None: not kept), and a neuron_parallel_compile
                # pass before the run (True, or a dict of flags to change for it, e.g. {"steps_this_run": 2})
                "neuron_cache": "neuron-cache/", "precompile": False,
                # flags of the command whose store URLs are copied to each node's disk first (["data_dir"])
                "stage": None}


class MonitorDecorator(StepDecorator):
    """Samples the task's node every `interval` s into the store: CPU% and RSS of the task's process tree, host
    memory, GPUs through NVML and NeuronCores through neuron-monitor. `gpu` / `neuron`: True wants them (one
    warning when the tool is missing), None (default) uses them when the node has such devices, False skips."""

    name = "monitor"
    defaults = {"interval": 1, "gpu": None, "neuron": None}

    def validate(self) -> None:
        self._number("interval", minimum=0.05, kind=float)
        for k in ("gpu", "neuron"):
            if self.attributes[k] not in (None, True, False):
                raise ConfigError(f"@{self.name}({k}={self.attributes[k]!r}): use True, False or None (auto)")


class NeuronMonitorDecorator(MonitorDecorator):
    """Metaflow's name for @monitor on Trainium/Inferentia: NeuronCore sampling is wanted (neuron=True)."""

    name = "neuron_monitor"
    defaults = {"interval": 1, "gpu": None, "neuron": True}


class CardDecorator(StepDecorator):
    """A card for the step (Metaflow's @card): `type` "default" (the task's artifacts and your components) or
    "blank" (your components only); `id` names it when a step has several; `refresh_interval` (s) rate-limits
    `current.card.refresh()`; `options` {"title": ...}; `timeout` is accepted for Metaflow compatibility."""

    name = "card"
    defaults = {"type": "default", "id": None, "options": None, "timeout": 45, "refresh_interval": 5,
                "save_errors": True}
    allow_multiple = True

    def validate(self) -> None:
        if self.attributes["type"] not in ("default", "blank"):
            raise ConfigError(f"@card(type={self.attributes['type']!r}): stoker has the card types 'default' and "
                              f"'blank'; build custom content with components (stoker.cards)")
        cid = self.attributes["id"]
        if cid is not None and (not isinstance(cid, str) or not cid.replace("_", "a").replace("-", "a").isalnum()):
            raise ConfigError(f"@card(id={cid!r}): use letters, digits, '_' and '-' only, e.g. id=\"training\"")
        if self.attributes["options"] is not None and not isinstance(self.attributes["options"], dict):
            raise ConfigError("@card(options=...) takes a dict, e.g. options={\"title\": \"Training\"}")
        self._number("refresh_interval", kind=float)
        self._number("timeout", kind=float)


class FlowDecorator(StepDecorator):
    """Base of flow-level decorators (`@project`): applied to the FlowSpec class, kept in
    `_stoker_flow_decorators` (a subclass inherits them)."""

    @classmethod
    def make(cls) -> Callable:
        def decorator(flow_cls: type | None = None, **attributes: Any) -> Any:
            def attach(klass: type) -> type:
                if not isinstance(klass, type):
                    raise ConfigError(f"@{cls.name} decorates a FlowSpec class, not {klass!r}")
                if any(d.name == cls.name for d in klass.__dict__.get("_stoker_flow_decorators", ())):
                    raise ConfigError(f"flow {klass.__name__} already has a decorator @{cls.name}: each flow "
                                      f"decorator can be given only once")
                own = [d for d in getattr(klass, "_stoker_flow_decorators", ()) if d.name != cls.name]
                klass._stoker_flow_decorators = (*own, cls(attributes))
                return klass

            return attach(flow_cls) if isinstance(flow_cls, type) else attach

        decorator.__doc__ = cls.__doc__
        decorator.__name__ = cls.name
        return decorator


def get_flow_decorator(flow_cls: type, name: str) -> FlowDecorator | None:
    """The flow-level decorator `name` of a flow class, or None."""
    return next((d for d in getattr(flow_cls, "_stoker_flow_decorators", ()) if d.name == name), None)


DECORATORS: dict[str, type[StepDecorator]] = {
    d.name: d for d in (RetryDecorator, CatchDecorator, TimeoutDecorator, ResourcesDecorator,
                        EnvironmentDecorator, ParallelDecorator, TorchrunDecorator, MonitorDecorator,
                        NeuronMonitorDecorator, CardDecorator)
}


def register_decorator(cls: type[StepDecorator]) -> type[StepDecorator]:
    """Make a decorator class usable by name, e.g. from `--with` (backends register theirs)."""
    DECORATORS[cls.name] = cls
    return cls


def step(func: Callable) -> Callable:
    """Mark a FlowSpec method as a step."""
    if getattr(func, "is_step", False):
        func.decorator_errors.append(f"@step is applied twice to {func.__name__}")
        return func
    func.is_step = True
    func.decorators = list(getattr(func, "decorators", []))
    func.decorator_errors = list(getattr(func, "decorator_errors", []))
    pending = getattr(func, "_pending_decorators", [])
    for d in pending:
        func.decorator_errors.append(f"@{d.name} is placed below @step on {func.__name__}: put @step last, "
                                     f"right above `def {func.__name__}`")
    return func


def _attach(cls: type[StepDecorator], func: Callable, attributes: dict[str, Any]) -> Callable:
    deco = cls(attributes)
    if not getattr(func, "is_step", False):
        func._pending_decorators = [*getattr(func, "_pending_decorators", []), deco]
        return func
    for existing in func.decorators:
        if existing.name == deco.name and not deco.allow_multiple:
            func.decorator_errors.append(f"@{deco.name} is applied twice to step {func.__name__}")
    func.decorators.append(deco)
    return func


def _make(cls: type[StepDecorator]) -> Callable:
    @functools.wraps(cls)
    def decorator(f: Callable | None = None, **attributes: Any) -> Callable:
        if f is not None and callable(f):
            return _attach(cls, f, attributes)
        return lambda func: _attach(cls, func, attributes)

    decorator.__doc__ = cls.__doc__
    return decorator


retry = _make(RetryDecorator)
catch = _make(CatchDecorator)
timeout = _make(TimeoutDecorator)
resources = _make(ResourcesDecorator)
environment = _make(EnvironmentDecorator)
parallel = _make(ParallelDecorator)
torchrun = _make(TorchrunDecorator)
monitor = _make(MonitorDecorator)
neuron_monitor = _make(NeuronMonitorDecorator)
card = _make(CardDecorator)


def parse_with(spec: str) -> StepDecorator:
    """`retry:times=2,minutes_between_retries=0` -> RetryDecorator. Values are parsed as JSON when possible."""
    from .parameters import parse_override_value

    name, _, rest = spec.partition(":")
    name = name.strip()
    if name not in DECORATORS:
        raise ConfigError(f"--with {spec}: unknown decorator {name!r}; known: {', '.join(sorted(DECORATORS))}")
    attrs: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq:
            raise ConfigError(f"--with {spec}: expected key=value, got {part!r}")
        attrs[key.strip()] = parse_override_value(value.strip())
    return DECORATORS[name](attrs, statically_defined=False)


def get_decorator(func: Callable, name: str) -> StepDecorator | None:
    for d in getattr(func, "decorators", []):
        if d.name == name or (name == "parallel" and isinstance(d, ParallelDecorator)):
            return d
    return None


def apply_with(flow_cls: type, specs: list[str]) -> None:
    """Attach `--with NAME:k=v` decorators to every step that does not already have one of that name."""
    for spec in specs:
        template = parse_with(spec)
        for attr in dir(flow_cls):
            func = getattr(flow_cls, attr, None)
            if not (callable(func) and getattr(func, "is_step", False)):
                continue
            if isinstance(template, ParallelDecorator):
                raise ConfigError(f"--with {spec}: @{template.name} marks gang steps and cannot be added to every "
                                  f"step; put it on the step in the flow file")
            if get_decorator(func, template.name) is None:
                func.decorators.append(type(template)(dict(template.attributes), statically_defined=False))
