"""`@step`, the base of every decorator (`StepDecorator`, `FlowDecorator`) and its typed hooks, and `@parallel`.

A decorator records settings on the step function and acts through the hooks below; the engine calls the hooks
of whatever decorators a step has and knows none of them by name. Each feature (@retry, @catch, @timeout,
@environment, @secrets, @card, @monitor, @torchrun, @resources, @project) is one module of `stoker.features`;
the backends' @slurm and @batch live in `stoker.backends.*.decorator`. They can also be attached from the CLI:
`run --with retry:times=2 --with resources:cpu=2`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stoker.errors import ConfigError
from stoker.flow.configs import UNPACK_KEY, has_delayed, resolve_delayed, unpack_delayed

StepCall = Callable[[], Any]


@dataclass
class TaskContext:
    """What a task-side hook sees of one task attempt (runtime/member/task.py builds it).

    `spec` is the attempt's TaskSpec, `node` the step's graph node, `parallel` its `current.parallel`, `flow`
    the FlowSpec instance the step runs on, `manifest` the attempt's manifest as it is being written (a hook may
    add to it), `last_attempt` whether a failure now ends the step. `state` keeps what a hook needs between its
    calls in this attempt (a monitor, the cards), keyed by the decorator's name.
    """

    spec: Any
    flow_cls: type
    func: Callable
    node: Any
    store: Any
    tempdir: str
    parallel: Any
    flow: Any = None
    manifest: Any = field(default_factory=dict)  # a store.manifest.Manifest in a task (read and set like a dict)
    last_attempt: bool = False
    state: dict[str, Any] = field(default_factory=dict)
    inputs: Any = None  # a join's `inputs` (None in other steps)


class StepDecorator:
    """Base of step decorators: `name`, `defaults` and the resolved `attributes`, and the hooks a feature overrides.

    Task side (in the task's process, each hook called for every decorator of the step and of the flow, in
    ascending `order`; `task_finished` in descending order, as a stack unwinds):
      task_started(ctx)              before the step: environment, `current` attributes, samplers, cards
      task_decorate(ctx, call)       wrap the step's call (lower `order`: nearer the step's own code)
      task_post_step(ctx)            the step returned
      task_exception(ctx, exc)       the step raised: True when the decorator handled it (the flow goes on)
      task_finished(ctx)             the manifest is complete, not yet stored; also after a failure
    Driver side (in the run's process):
      retries()                      attempts after the first one
      retry_delay_s()                seconds between attempts
      deadline_s()                   wall-clock limit of one attempt (None: none)
      fallback_attempts(node_kind)   attempts that record a failure instead of running the step once the
                                     step's own are spent
      resources_request()            per-node resources asked of the backend (and of this machine)
      plan_problem(resources, options)  before anything starts: why this step cannot run as asked on a node with
                                     these resources and backend options (None: it can)
    """

    name = ""
    defaults: dict[str, Any] = {}
    allow_multiple = False
    order = 50  # where this decorator's effects sit among the others' (see the class docstring)
    fallback_note = ""  # what the run prints when it starts a fallback attempt
    engine: str | None = None  # a backend's decorator (@slurm, @batch): the backend it sends the step to

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

    # -- task-side hooks (no-ops unless a feature overrides them) ------------------------------------------
    def task_started(self, ctx: TaskContext) -> None:
        """Before the step runs (outside its error handling: a failure here is a task crash)."""

    def task_decorate(self, ctx: TaskContext, call: StepCall) -> StepCall:
        """The step's call, wrapped (or replaced)."""
        return call

    def task_post_step(self, ctx: TaskContext) -> None:
        """The step returned without an exception."""

    def task_exception(self, ctx: TaskContext, exc: BaseException) -> bool:
        """The step raised `exc` (printed already); return True when this decorator handled it."""
        return False

    def task_finished(self, ctx: TaskContext) -> None:
        """The attempt is over and `ctx.manifest` says how; it is stored after this. Must not raise."""

    # -- driver-side hooks -------------------------------------------------------------------------------
    def retries(self) -> int:
        return 0

    def retry_delay_s(self) -> float:
        return 0.0

    def deadline_s(self) -> float | None:
        return None

    def fallback_attempts(self, node_kind: str) -> int:
        return 0

    def resources_request(self) -> dict[str, Any]:
        return {}

    def spares(self) -> int:
        """Hot spares a gang step asks for beside its nodes (`@torchrun(spares=k)`)."""
        return 0

    def plan_problem(self, resources: dict[str, Any], options: dict[str, Any]) -> str | None:
        return None

    # -- arguments ---------------------------------------------------------------------------------------
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


class ParallelDecorator(StepDecorator):
    """Marks a gang step (the target of `self.next(..., num_parallel=N)`); the graph reads it."""

    name = "parallel"
    defaults = {}


class FlowDecorator(StepDecorator):
    """Base of flow-level decorators (`@project`): applied to the FlowSpec class, kept in
    `_stoker_flow_decorators` (a subclass inherits them). Their task-side hooks run in every task of the flow;
    `run_finished` in the run's process once the run has ended."""

    def run_finished(self, flow_file: str, pathspec: str, succeeded: bool) -> None:
        """The run `pathspec` (FLOW/RUN_ID) of `flow_file` has ended and said how (`@exit_hook`)."""

    @classmethod
    def make(cls) -> Callable:
        def decorator(flow_cls: type | None = None, **attributes: Any) -> Any:
            def attach(klass: type) -> type:
                if not isinstance(klass, type):
                    raise ConfigError(f"@{cls.name} decorates a FlowSpec class, not {klass!r}")
                if not cls.allow_multiple and any(d.name == cls.name
                                                  for d in klass.__dict__.get("_stoker_flow_decorators", ())):
                    raise ConfigError(f"flow {klass.__name__} already has a decorator @{cls.name}: each flow "
                                      f"decorator can be given only once")
                own = [d for d in getattr(klass, "_stoker_flow_decorators", ())
                       if d.name != cls.name or cls.allow_multiple]
                klass._stoker_flow_decorators = (*own, cls(attributes))
                return klass

            return attach(flow_cls) if isinstance(flow_cls, type) else attach

        decorator.__doc__ = cls.__doc__
        decorator.__name__ = cls.name
        decorator.__wrapped__ = cls  # what a FlowMutator's add_decorator(project, ...) adds
        FLOW_DECORATORS[cls.name] = cls
        return decorator


# name -> class of the flow decorators (`@project`): what a FlowMutator can add by name ("project:name=x")
FLOW_DECORATORS: dict[str, type[FlowDecorator]] = {}


def get_flow_decorator(flow_cls: type, name: str) -> FlowDecorator | None:
    """The flow-level decorator `name` of a flow class, or None."""
    return next((d for d in getattr(flow_cls, "_stoker_flow_decorators", ()) if d.name == name), None)


def task_decorators(flow_cls: type, func: Callable) -> list[StepDecorator]:
    """The decorators whose hooks run in a task of `func`: the flow's, then the step's (`--with` ones included),
    in ascending `order` (stable: as given among equals)."""
    decos = [*getattr(flow_cls, "_stoker_flow_decorators", ()), *getattr(func, "decorators", [])]
    return sorted(decos, key=lambda d: d.order)


# name -> class: what `--with NAME:...` can attach. Each feature module registers its own (stoker.features).
DECORATORS: dict[str, type[StepDecorator]] = {ParallelDecorator.name: ParallelDecorator}


def register_decorator(cls: type[StepDecorator]) -> type[StepDecorator]:
    """Make a decorator class usable by name, e.g. from `--with` (every feature and backend registers its own)."""
    DECORATORS[cls.name] = cls
    return cls


def step(func: Callable) -> Callable:
    """Mark a FlowSpec method as a step."""
    if getattr(func, "is_step", False):
        func.decorator_errors.append(f"@step is applied twice to {func.__name__}")
        return func
    func.is_step = True
    func.decorators = list(getattr(func, "decorators", []))
    func.wrappers = []  # UserStepDecorators (flow/user_decorators.py), as Metaflow's step functions keep them
    func.config_decorators = []  # StepMutators
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


def make_step_decorator(cls: type[StepDecorator]) -> Callable:
    """Register `cls` (for `--with`) and return its decorator function: what a feature module ends with."""
    register_decorator(cls)
    return _make(cls)


parallel = make_step_decorator(ParallelDecorator)


def parse_with(spec: str) -> StepDecorator:
    """`retry:times=2,minutes_between_retries=0` -> RetryDecorator. Values are parsed as JSON when possible."""
    from stoker.flow.parameters import parse_override_value

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


def user_with(spec: str) -> tuple[type, list[Any], dict[str, Any]] | None:
    """`--with mymodule.my_deco:k=v`: a user step decorator or step mutator named by its module path (the module
    is imported, as Metaflow does) or by a name it is registered under; None for a built-in decorator's name."""
    import importlib

    from stoker.flow.user_decorators import UserStepDecoratorBase, UserStepDecoratorMeta, parse_decospec

    name, args, kwargs = parse_decospec(spec)
    if name in DECORATORS:
        return None
    found = UserStepDecoratorMeta._registry.find(name)
    module, _, attr = name.rpartition(".")
    if found is None and module:
        try:
            found = getattr(importlib.import_module(module), attr, None)
        except ImportError as e:
            raise ConfigError(f"--with {spec}: cannot import {module!r} ({e}); put the module beside the flow or "
                              f"on PYTHONPATH") from None
    if not (isinstance(found, type) and issubclass(found, UserStepDecoratorBase)):
        raise ConfigError(f"--with {spec}: unknown decorator {name!r}; known: {', '.join(sorted(DECORATORS))}, or "
                          f"module.name of a @user_step_decorator, UserStepDecorator or StepMutator")
    return found, args, kwargs


def apply_with(flow_cls: type, specs: list[str]) -> None:
    """Attach `--with NAME:k=v` decorators to every step that does not already have one of that name (NAME is a
    built-in decorator, or `module.name` of a user step decorator or step mutator)."""
    for spec in specs:
        user = user_with(spec)
        if user is not None:
            cls, args, kwargs = user
            for attr in dir(flow_cls):
                func = getattr(flow_cls, attr, None)
                if callable(func) and getattr(func, "is_step", False):
                    cls(*args, **kwargs).add_or_raise(func, False, 1)  # 1: IGNORE a duplicate
            continue
        template = parse_with(spec)
        for attr in dir(flow_cls):
            func = getattr(flow_cls, attr, None)
            if not (callable(func) and getattr(func, "is_step", False)):
                continue
            if isinstance(template, ParallelDecorator):
                raise ConfigError(f"--with {spec}: @{template.name} marks gang steps and cannot be added to every "
                                  f"step; put it on the step in the flow file")
            if get_decorator(func, template.name) is None:
                func.decorators.append(type(template)(dict(template._raw), statically_defined=False))
