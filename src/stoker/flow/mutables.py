"""`MutableStep` and `MutableFlow`, what a StepMutator / FlowMutator changes, and `apply_user_decorators`, which
runs the mutators once per process when the run's Config values are known.

As Metaflow 2.19 (metaflow/user_decorators/mutable_step.py, mutable_flow.py; flowspec.py
`_process_config_decorators`, decorators.py `_init_step_decorators`): the flow's mutators' `pre_mutate`, then each
step's mutators' `pre_mutate`, then (after `--with`) the flow's `mutate` and the steps' `mutate`. Parameters and
flow decorators can be changed only in `pre_mutate`; step decorators in both; step mutators only in `pre_mutate`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from stoker.errors import ConfigError
from stoker.flow.configs import bind_configs, config_values_by_name, has_delayed
from stoker.flow.decorators import DECORATORS, FLOW_DECORATORS, FlowDecorator, StepDecorator
from stoker.flow.parameters import Parameter
from stoker.flow.user_decorators import (
    FlowMutator,
    FlowMutatorMeta,
    StepMutator,
    UserStepDecoratorBase,
    UserStepDecoratorMeta,
    flow_mutators,
    parse_decospec,
    unwrap_step_attributes,
)

IGNORE, ERROR, OVERRIDE = 1, 2, 3
_CACHES = ("_stoker_run_input_names", "_stoker_constant_names")


def step_functions(flow_cls: type) -> list[Callable]:
    return [f for a in dir(flow_cls) if callable(f := getattr(flow_cls, a, None)) and getattr(f, "is_step", False)]


def _deco_class(deco_type: Any, base: type) -> type | None:
    """The decorator class behind `retry` (a stoker decorator function), a class, or None."""
    cls = deco_type if isinstance(deco_type, type) else getattr(deco_type, "__wrapped__", None)
    return cls if isinstance(cls, type) and issubclass(cls, base) else None


def _spec(deco: Any) -> tuple[str, str, list[Any], dict[str, Any]]:
    if isinstance(deco, UserStepDecoratorBase | FlowMutator):
        registry = type(type(deco))._registry
        return (registry.short_name(type(deco)), deco.decorator_name, *deco.get_args_kwargs())
    cls = type(deco)
    attrs = dict(deco.attributes)
    raw = getattr(deco, "_raw", {})
    for k in getattr(deco, "user_defined", ()):  # the values as the user gave them (`cpu=16`, not validate's 16.0)
        if k in raw and not has_delayed({k: raw[k]}):
            attrs[k] = raw[k]
    return deco.name, f"{cls.__module__}.{cls.__name__}", [], attrs


def _matches(name: str, fq: str, query: str) -> bool:
    return fq == query if "." in query else name == query


def _add_with_policy(existing: list, new: Any, duplicates: int, statically_defined: bool, where: str) -> list | None:
    """The list with `new` added under the duplicates policy (None: not added)."""
    same = [d for d in existing if d.name == new.name]
    if new.allow_multiple or not same:
        return [*existing, new]
    if duplicates == OVERRIDE:
        return [*(d for d in existing if d.name != new.name), new]
    if duplicates == ERROR and statically_defined:
        raise ConfigError(f"@{new.name} is applied twice to {where}")
    if duplicates not in (IGNORE, ERROR):
        raise ValueError(f"invalid duplicates value: {duplicates}")
    return None


class _Mutable:
    IGNORE, ERROR, OVERRIDE = IGNORE, ERROR, OVERRIDE

    def __init__(self, flow_cls: type, pre_mutate: bool, statically_defined: bool, inserted_by: list[str]) -> None:
        self._flow_cls, self._pre_mutate = flow_cls, pre_mutate
        self._statically_defined, self._inserted_by = statically_defined, inserted_by

    def _only_in_pre_mutate(self, what: str) -> None:
        if not self._pre_mutate:
            raise ConfigError(f"{what} from {self._inserted_by} is only allowed in the `pre_mutate` method and not "
                              f"the `mutate` method")

    def has_decorator(self, name: str) -> bool:
        return any(_matches(n, fq, name) for n, fq, _, _ in self.decorator_specs)

    def get_decorator_specs(self, name: str) -> list[tuple[str, str, list[Any], dict[str, Any]]]:
        return [(n, fq, list(a), dict(k)) for n, fq, a, k in self.decorator_specs if _matches(n, fq, name)]


class MutableStep(_Mutable):
    """One step as a mutator sees it: its decorators (`decorator_specs`), `add_decorator`, `remove_decorator`."""

    def __init__(self, flow_cls: type, step: Callable, pre_mutate: bool = False, statically_defined: bool = False,
                 inserted_by: list[str] | None = None) -> None:
        if inserted_by is None:
            raise ConfigError("MutableStep should only be created by StepMutators or FlowMutators")
        super().__init__(flow_cls, pre_mutate, statically_defined, inserted_by)
        self._my_step = step

    @property
    def flow(self) -> MutableFlow:
        return MutableFlow(self._flow_cls, self._pre_mutate, self._statically_defined, self._inserted_by)

    @property
    def decorator_specs(self) -> Iterator[tuple[str, str, list[Any], dict[str, Any]]]:
        """(short name, full name, args, kwargs) of each decorator of the step, user ones included."""
        for d in self._my_step.decorators:
            yield _spec(d)
        seen: set[int] = set()
        for d in [*self._my_step.wrappers, *self._my_step.config_decorators]:
            if id(d) not in seen:
                seen.add(id(d))
                yield _spec(d)

    def add_decorator(self, deco_type: Any, deco_args: list[Any] | None = None,
                      deco_kwargs: dict[str, Any] | None = None, duplicates: int = IGNORE) -> Any:
        """Add a decorator (`retry`, a UserStepDecorator or StepMutator class, or a spec `"retry:times=2"`) with
        these arguments; returns it, or None when `duplicates` kept the existing one."""
        deco_type, args, kwargs = _resolve(
            deco_type, deco_args, deco_kwargs, "decorator", "has arguments",
            lambda name: DECORATORS.get(name) or UserStepDecoratorMeta._registry.find(name),
            lambda name: f"add_decorator({name!r}): no such step decorator; known: {', '.join(sorted(DECORATORS))} "
                         f"and the user step decorators defined")
        user = _deco_class(deco_type, UserStepDecoratorBase)
        if user is not None:
            if not self._pre_mutate and issubclass(user, StepMutator):
                raise ConfigError(f"Adding step mutator '{user.decorator_name}' from {self._inserted_by} is only "
                                  f"allowed in the `pre_mutate` method and not the `mutate` method")
            added = user(*args, **kwargs).add_or_raise(self._my_step, self._statically_defined, duplicates,
                                                       self._inserted_by)
            if added is not None:
                added.external_init()
            return added
        cls = _deco_class(deco_type, StepDecorator)
        if cls is None or issubclass(cls, FlowDecorator):
            raise TypeError("add_decorator takes a stoker step decorator or a user step decorator")
        if args:
            raise ConfigError("Step decorators do not take additional positional arguments")
        new = cls(kwargs, statically_defined=self._statically_defined)
        new.inserted_by = self._inserted_by
        decos = _add_with_policy(self._my_step.decorators, new, duplicates, self._statically_defined,
                                 f"step {self._my_step.__name__}")
        if decos is None:
            return None
        self._my_step.decorators[:] = decos
        return new

    def remove_decorator(self, deco_name: str, deco_args: list[Any] | None = None,
                         deco_kwargs: dict[str, Any] | None = None) -> bool:
        """Remove the decorators named `deco_name` (only those with these arguments, when given)."""
        every = deco_args is None and deco_kwargs is None
        wanted = (list(deco_args or []), dict(deco_kwargs or {}))
        user = UserStepDecoratorMeta._registry.find(deco_name)
        removed = False
        if user is not None:
            for field in ("config_decorators", "wrappers"):
                keep = []
                for d in getattr(self._my_step, field):
                    if d.decorator_name == user.decorator_name and (every or d.get_args_kwargs() == wanted):
                        if not self._pre_mutate and isinstance(d, StepMutator):
                            raise ConfigError(f"Removing step mutator '{d.decorator_name}' from "
                                              f"{self._inserted_by} is only allowed in the `pre_mutate` method")
                        removed = True
                    else:
                        keep.append(d)
                getattr(self._my_step, field)[:] = keep
            if removed:
                return True
        keep = [d for d in self._my_step.decorators
                if not (d.name == deco_name and (every or ([], dict(d.attributes)) == wanted))]
        removed = len(keep) != len(self._my_step.decorators)
        self._my_step.decorators[:] = keep
        return removed


class MutableFlow(_Mutable):
    """The flow as a FlowMutator sees it: `configs`, `parameters`, `steps`, its decorators and, in
    `pre_mutate`, `add_parameter` / `remove_parameter` / `add_decorator` / `remove_decorator`."""

    def __init__(self, flow_cls: type, pre_mutate: bool = False, statically_defined: bool = False,
                 inserted_by: list[str] | None = None) -> None:
        if inserted_by is None:
            raise ConfigError("MutableFlow should only be created by StepMutators or FlowMutators")
        super().__init__(flow_cls, pre_mutate, statically_defined, inserted_by)

    @property
    def decorator_specs(self) -> Iterator[tuple[str, str, list[Any], dict[str, Any]]]:
        for d in getattr(self._flow_cls, "_stoker_flow_decorators", ()):
            yield _spec(d)
        for m in flow_mutators(self._flow_cls):
            yield _spec(m)

    @property
    def configs(self) -> Iterator[tuple[str, Any]]:
        """(name, value) of each Config of the flow, its value as the run resolved it."""
        yield from _state(self._flow_cls)["configs"].items()

    @property
    def parameters(self) -> Iterator[tuple[str, Parameter]]:
        for attr, p in self._flow_cls._run_inputs().items():
            if isinstance(p, Parameter):
                yield attr, p

    @property
    def steps(self) -> Iterator[tuple[str, MutableStep]]:
        for f in step_functions(self._flow_cls):
            yield f.__name__, MutableStep(self._flow_cls, f, self._pre_mutate, self._statically_defined,
                                          self._inserted_by)

    def add_parameter(self, name: str, value: Parameter, overwrite: bool = False) -> None:
        self._only_in_pre_mutate(f"Adding parameter '{name}'")
        if hasattr(self._flow_cls, name) and not overwrite:
            raise ConfigError(f"Flow '{self._flow_cls.__name__}' already has a class member '{name}' -- set "
                              f"overwrite=True in add_parameter to overwrite it.")
        if not isinstance(value, Parameter):
            raise ConfigError(f"Only a Parameter or an IncludeFile can be added using `add_parameter`; got "
                              f"{type(value)}")
        setattr(self._flow_cls, name, value)
        _forget_caches(self._flow_cls)

    def remove_parameter(self, parameter_name: str) -> bool:
        self._only_in_pre_mutate(f"Removing parameter '{parameter_name}'")
        for attr, p in self._flow_cls._run_inputs().items():
            if isinstance(p, Parameter) and p.name == parameter_name:
                for klass in self._flow_cls.__mro__:
                    if attr in klass.__dict__:
                        delattr(klass, attr)
                        break
                _forget_caches(self._flow_cls)
                return True
        return False

    def add_decorator(self, deco_type: Any, deco_args: list[Any] | None = None,
                      deco_kwargs: dict[str, Any] | None = None, duplicates: int = IGNORE) -> Any:
        """Add a flow decorator (`project`, `"project:name=x"`) or a FlowMutator class (its `pre_mutate` runs
        after those of the mutators already there)."""
        self._only_in_pre_mutate(f"Adding flow-decorator '{deco_type}'")
        deco_type, args, kwargs = _resolve(
            deco_type, deco_args, deco_kwargs, "flow decorator", "already contains arguments",
            lambda name: FLOW_DECORATORS.get(name) or FlowMutatorMeta._registry.find(name),
            lambda name: f"add_decorator({name!r}): no such flow decorator or FlowMutator")
        mutator = _deco_class(deco_type, FlowMutator)
        if mutator is not None:
            same = [m for m in flow_mutators(self._flow_cls) if m.decorator_name == mutator.decorator_name]
            if same and duplicates != OVERRIDE:
                if duplicates == ERROR and self._statically_defined:
                    raise ConfigError(f"Duplicate FlowMutator '{mutator.decorator_name}' on flow")
                return None
            m = mutator(*args, **kwargs)
            m.statically_defined, m.inserted_by = self._statically_defined, self._inserted_by
            for klass in self._flow_cls.__mro__:  # OVERRIDE: the existing one goes
                if "_stoker_flow_mutators" in klass.__dict__:
                    klass._stoker_flow_mutators = tuple(x for x in klass.__dict__["_stoker_flow_mutators"]
                                                        if x not in same)
            m._set_flow_cls(self._flow_cls)
            m.external_init()
            return m
        cls = _deco_class(deco_type, FlowDecorator)
        if cls is None:
            raise TypeError("add_decorator takes a flow decorator or a FlowMutator")
        if args:
            raise ConfigError("Flow decorators do not take additional positional arguments")
        new = cls(kwargs, statically_defined=self._statically_defined)
        new.inserted_by = self._inserted_by
        decos = _add_with_policy(list(getattr(self._flow_cls, "_stoker_flow_decorators", ())), new, duplicates,
                                 self._statically_defined, f"flow {self._flow_cls.__name__}")
        if decos is None:
            return None
        self._flow_cls._stoker_flow_decorators = tuple(decos)
        return new

    def remove_decorator(self, deco_name: str, deco_args: list[Any] | None = None,
                         deco_kwargs: dict[str, Any] | None = None) -> bool:
        self._only_in_pre_mutate(f"Removing flow-decorator '{deco_name}'")
        if any(_matches(*_spec(m)[:2], deco_name) for m in flow_mutators(self._flow_cls)):
            raise ConfigError(f"Cannot remove FlowMutator '{deco_name}'. FlowMutators are processed during "
                              f"iteration and cannot be removed. Only flow decorators (e.g. @project) can be removed.")
        every = deco_args is None and deco_kwargs is None
        wanted = (list(deco_args or []), dict(deco_kwargs or {}))
        decos = list(getattr(self._flow_cls, "_stoker_flow_decorators", ()))
        keep = [d for d in decos if not (d.name == deco_name and (every or ([], dict(d.attributes)) == wanted))]
        self._flow_cls._stoker_flow_decorators = tuple(keep)
        return len(keep) != len(decos)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        attr = getattr(self._flow_cls, name, None)
        if callable(attr) and getattr(attr, "is_step", False):
            return MutableStep(self._flow_cls, attr, self._pre_mutate, self._statically_defined, self._inserted_by)
        configs = _state(self._flow_cls)["configs"]
        for attr_name, p in self._flow_cls._run_inputs().items():
            if attr_name == name:
                return configs.get(p.name) if getattr(p, "IS_CONFIG", False) else p
        raise AttributeError(name)


def _state(flow_cls: type) -> dict[str, Any]:
    return flow_cls.__dict__.get("_stoker_user_decorators_state") or {"configs": {}}


def _forget_caches(flow_cls: type) -> None:
    for name in _CACHES:
        if name in flow_cls.__dict__:
            delattr(flow_cls, name)


def has_user_decorators(flow_cls: type) -> bool:
    """Whether the flow has mutators or user step decorators (what `apply_user_decorators` would act on)."""
    return bool(flow_mutators(flow_cls)) or any(getattr(f, "config_decorators", None) or getattr(f, "wrappers", None)
                                                for f in step_functions(flow_cls))


def apply_user_decorators(flow_cls: type, values: dict[str, Any]) -> bool:
    """Run the flow's FlowMutators and StepMutators with the run's Config `values` (by attribute), once per
    process, and initialise its user step decorators. True when they ran now (the flow may have changed)."""
    if "_stoker_user_decorators_state" in flow_cls.__dict__ or not has_user_decorators(flow_cls):
        return False
    unwrap_step_attributes(flow_cls)
    flow_cls._stoker_user_decorators_state = {"configs": config_values_by_name(flow_cls, values)}
    bind_configs(flow_cls, values)  # config expressions in the mutators' arguments
    mutators = flow_mutators(flow_cls)
    for m in mutators:
        m.external_init()
    _run_flow_phase(flow_cls, pre=True)
    steps = step_functions(flow_cls)
    for f in steps:
        for d in f.config_decorators:
            d.external_init()
    for f in steps:
        i = 0
        while i < len(f.config_decorators):  # a pre_mutate may add step mutators: they run too
            d = f.config_decorators[i]
            d.pre_mutate(MutableStep(flow_cls, f, True, d.statically_defined, [d.decorator_name]))
            i += 1
    _run_flow_phase(flow_cls, pre=False)
    for f in step_functions(flow_cls):
        for d in list(f.config_decorators):
            d.mutate(MutableStep(flow_cls, f, False, d.statically_defined,
                                 [d.decorator_name, *(d.inserted_by or [])]))
        for w in f.wrappers:
            w.external_init()
    _forget_caches(flow_cls)
    return True


def _run_flow_phase(flow_cls: type, pre: bool) -> None:
    i = 0
    while i < len(mutators := flow_mutators(flow_cls)):  # a pre_mutate may add FlowMutators: they run too
        m = mutators[i]
        mutable = MutableFlow(flow_cls, pre, m.statically_defined, [m.decorator_name, *(m.inserted_by or [])])
        (m.pre_mutate if pre else m.mutate)(mutable)
        i += 1


__all__ = ["IGNORE", "ERROR", "OVERRIDE", "MutableFlow", "MutableStep", "apply_user_decorators",
           "has_user_decorators"]


def _resolve(deco_type: Any, deco_args: list[Any] | None, deco_kwargs: dict[str, Any] | None, what: str,
             has: str, lookup: Any, unknown: Any) -> tuple[Any, list[Any], dict[str, Any]]:
    """`add_decorator`'s (type, args, kwargs): a decospec string (`"retry:times=2"`) is parsed and looked up (Metaflow
    refuses arguments given both in the string and apart); a type is kept as it is."""
    args, kwargs = list(deco_args or []), dict(deco_kwargs or {})
    if not isinstance(deco_type, str):
        return deco_type, args, kwargs
    name, s_args, s_kwargs = parse_decospec(deco_type)
    if (args or kwargs) and (s_args or s_kwargs):
        raise ConfigError(f"Cannot specify additional arguments when adding a {what} using a decospec that {has}")
    found = lookup(name)
    if found is None:
        raise ConfigError(unknown(name))
    return found, args or s_args, kwargs or s_kwargs
