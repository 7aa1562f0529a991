"""Metaflow 2.19's custom decorators: `UserStepDecorator`, `@user_step_decorator`, `StepMutator`, `FlowMutator`.

They follow metaflow/user_decorators/ (user_step_decorator.py, user_flow_decorator.py):
- a `UserStepDecorator` (or a generator made one by `@user_step_decorator`) is kept in the step function's
  `wrappers`; in the task its `pre_step(step_name, flow, inputs)` runs before the step and `post_step(step_name,
  flow, exception)` after it, outermost first (features/user_wrappers.py runs them);
- a `StepMutator` is kept in the step's `config_decorators`, a `FlowMutator` on the flow class
  (`_stoker_flow_mutators`); their `pre_mutate` / `mutate` change the flow's decorators and parameters once the
  run's Config values are known (flow/mutables.py: `apply_user_decorators`).
Arguments may hold config expressions: `init(*args, **kwargs)` gets them evaluated (`external_init`).
"""

from __future__ import annotations

import inspect
import json
import re
import types
from collections.abc import Callable
from typing import Any

from stoker.errors import ConfigError
from stoker.flow.configs import resolve_delayed, unpack_delayed

USER_SKIP_STEP: dict[str, Any] = {}


class _Registry:
    """Decorator classes by their full name (`module.Class`), found by it or by any unique dotted suffix."""

    def __init__(self) -> None:
        self.by_name: dict[str, type] = {}
        self.retired: set[str] = set()

    def add(self, cls: type) -> None:
        if cls.decorator_name not in self.retired:
            self.by_name[cls.decorator_name] = cls

    def retire(self, cls: type) -> None:  # a subclass appeared: only the most derived one is registered
        self.by_name.pop(cls.decorator_name, None)
        self.retired.add(cls.decorator_name)

    def find(self, name: str) -> type | None:
        if name in self.by_name:
            return self.by_name[name]
        found = [c for full, c in self.by_name.items() if full.endswith("." + name)]
        return found[0] if len(found) == 1 else None

    def short_name(self, cls: type) -> str:
        """The shortest dotted suffix of its full name that names it alone (Metaflow's minimally unique name)."""
        parts = cls.decorator_name.split(".")
        for i in range(len(parts) - 1, -1, -1):
            if self.find(".".join(parts[i:])) is cls:
                return ".".join(parts[i:])
        return cls.decorator_name


class _Meta(type):
    _registry: _Registry
    _base_names: tuple[str, ...] = ()

    def __new__(mcs, name: str, bases: tuple, namespace: dict, **kw: Any) -> Any:
        cls = super().__new__(mcs, name, bases, namespace)
        cls.decorator_name = getattr(cls, "_decorator_name", f"{cls.__module__}.{cls.__qualname__}")
        if name in mcs._base_names:
            return cls
        for base in bases:
            if isinstance(base, _Meta) and base.__name__ not in mcs._base_names:
                mcs._registry.retire(base)
        mcs._registry.add(cls)
        return cls


class UserStepDecoratorMeta(_Meta):
    _registry = _Registry()
    _base_names = ("UserStepDecoratorBase", "UserStepDecorator", "StepMutator")

    def __str__(cls) -> str:
        return f"{cls.__name__ if cls.__name__ != 'WrapClass' else 'UserStepDecorator'}({cls.decorator_name})"


def parse_decospec(spec: str) -> tuple[str, list[Any], dict[str, Any]]:
    """`name:k=v,0=v2` -> (name, args, kwargs), values read as JSON, else int, float or the string (Metaflow's
    extract_args_kwargs_from_decorator_spec)."""
    name, _, rest = spec.partition(":")
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for part in re.split(r""",(?=[\s\w]+=)""", rest) if rest else []:
        key, _, raw = part.partition("=")
        raw = raw.strip()
        try:
            val: Any = json.loads(raw.replace('\\"', '"'))
        except json.JSONDecodeError:
            val = raw
            for kind in (int, float):
                try:
                    val = kind(raw)
                    break
                except ValueError:
                    pass
        if key.strip().isdigit():
            pos = int(key)
            args.extend([None] * (pos + 1 - len(args)))
            args[pos] = val
        else:
            kwargs[key.strip()] = val
    return name.strip(), args, kwargs


class _Initable:
    """`external_init`: the arguments with config expressions evaluated, given to the subclass's `init`."""

    _args: Any
    _kwargs: dict[str, Any]
    _ran_init = False

    def init(self, *args: Any, **kwargs: Any) -> None:
        pass

    def external_init(self) -> None:
        if self._ran_init:
            return
        self._args = [resolve_delayed(a) for a in self._args]
        kwargs, _ = unpack_delayed(self._kwargs)
        self._kwargs = {k: resolve_delayed(v) for k, v in kwargs.items()}
        defines_init = "init" in type(self).__dict__
        if (self._args or self._kwargs) and not defines_init:
            raise ConfigError(f"{self} is used with arguments but does not implement init")
        if defines_init:
            self.init(*self._args, **self._kwargs)
        self._ran_init = True

    def get_args_kwargs(self) -> tuple[list[Any], dict[str, Any]]:
        return list(self._args), dict(self._kwargs)

    def __str__(self) -> str:
        return str(type(self))


class UserStepDecoratorBase(_Initable, metaclass=UserStepDecoratorMeta):
    """What a user step decorator and a step mutator share: how they are applied to a step function."""

    _step_field: str | None = None  # the step function's list that keeps it: "wrappers" or "config_decorators"
    _allowed_args: bool | list = False
    _allowed_kwargs: bool | list = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._my_step: Callable | None = None
        self._special = {"_statically_defined": True, "_inserted_by": None}
        self._ran_init = False
        self._kwargs = {}
        for k, v in kwargs.items():
            if k in self._special:
                self._special[k] = v
            else:
                self._kwargs[k] = v
        self._args = args
        arg = args[0]._my_step if args and isinstance(args[0], UserStepDecoratorBase) else \
            (args[0] if args else None)
        if arg is not None and callable(arg) and getattr(arg, "is_step", False):  # bare: @MyDecorator
            self._set_my_step(arg)
            self._args = args[1:]
        if self._args and not self._allowed_args:
            raise ConfigError(f"{self} does not allow arguments")
        if self._kwargs:
            allowed = self._allowed_kwargs
            if not allowed:
                raise ConfigError(f"{self} does not allow keyword arguments")
            if isinstance(allowed, list) and any(k not in allowed for k in self._kwargs):
                raise ConfigError(f"{self} only allows the keyword arguments {', '.join(allowed)}")

    def __get__(self, instance: Any, owner: Any) -> Any:  # `@MyDecorator` (bare) left this object in the class
        return self().__get__(instance, owner)

    def __call__(self, step: Any = None, **special: Any) -> Any:
        self._special.update(special)
        if step is not None:
            if isinstance(step, UserStepDecoratorBase):
                step = step._my_step
            return self._set_my_step(step)
        if self._my_step is None:
            raise ConfigError(f"{self} can only be applied to a step function")
        return self._my_step

    def _set_my_step(self, step: Callable) -> Callable:
        if not getattr(step, "is_step", False):
            raise ConfigError(f"{self} can only be applied to a step function (put @step below it), got {step!r}")
        self._my_step = step
        self.statically_defined = self._special["_statically_defined"]
        self.inserted_by = self._special["_inserted_by"]
        for name in self._all_step_fields():
            getattr(step, name).append(self)
        return step

    def _all_step_fields(self) -> list[str]:
        out: list[str] = []
        for klass in type(self).__mro__:
            f = klass.__dict__.get("_step_field")
            if f is not None and f not in out:
                out.append(f)
        return out

    def add_or_raise(self, step: Callable, statically_defined: bool, duplicates: int,
                     inserted_by: Any = None) -> UserStepDecoratorBase | None:
        """Put this decorator on `step` unless one of its kind is there (`duplicates`: MutableStep.IGNORE,
        OVERRIDE or ERROR); returns self when it was added."""
        existing = [d for d in getattr(step, self._step_field) if d.decorator_name == self.decorator_name]
        if existing and duplicates == 3:  # OVERRIDE
            for name in self._all_step_fields():
                setattr(step, name, [d for d in getattr(step, name) if d.decorator_name != self.decorator_name])
        elif existing:
            if duplicates == 2 and statically_defined:  # ERROR
                raise ConfigError(f"{self} is applied twice to step {step.__name__}")
            return None
        self(step, _statically_defined=statically_defined, _inserted_by=inserted_by)
        return self

    @classmethod
    def parse_decorator_spec(cls, deco_spec: str) -> UserStepDecoratorBase:
        _, args, kwargs = parse_decospec(":" + deco_spec if deco_spec else "")
        return cls(*args, **kwargs)


class UserStepDecorator(UserStepDecoratorBase):
    """Derive from this class for a decorator that runs code around a step: `init(**kwargs)` takes its
    arguments, `pre_step(step_name, flow, inputs)` runs before the step (return a callable to run instead of
    it, or set `self.skip_step`), `post_step(step_name, flow, exception)` after it (return None to swallow the
    exception, the exception to raise it, or `(exception, next_args)`)."""

    _step_field = "wrappers"
    _allowed_kwargs = True

    def pre_step(self, step_name: str, flow: Any, inputs: Any = None) -> Callable | None:
        return None

    def post_step(self, step_name: str, flow: Any, exception: BaseException | None = None) -> Any:
        return (exception, None) if exception else (None, None)

    @property
    def skip_step(self) -> bool | dict[str, Any]:
        """False, True (skip the step; the flow goes on as its `self.next` says), or the arguments of `self.next`."""
        return getattr(self, "_skip_step", False)

    @skip_step.setter
    def skip_step(self, value: bool | dict[str, Any]) -> None:
        self._skip_step = value


def user_step_decorator(*args: Any, **kwargs: Any) -> Any:
    """Make a generator function `f(step_name, flow, inputs[, attributes])` a step decorator: the code before its
    `yield` runs before the step, the code after it after the step (an exception of the step is raised at the
    `yield`; catching it makes the step succeed). Yield None to run the step, a callable to run instead of it
    (`fn(flow[, inputs])`, returning None, True or `self.next`'s arguments), or a dict to skip the step (`{}` or
    USER_SKIP_STEP: the step's own `self.next`; else `self.next`'s arguments)."""
    if not args:
        return lambda f: user_step_decorator(f, **kwargs)
    obj = args[0]
    if not isinstance(obj, types.FunctionType) or not inspect.isgeneratorfunction(obj):
        raise ConfigError("@user_step_decorator can only decorate generator functions")
    arg_count = len(inspect.signature(obj).parameters)
    if kwargs and arg_count != 4:
        raise ConfigError("@user_step_decorator(<kwargs>) can only decorate generator functions with 4 arguments "
                          "(step_name, flow, inputs, attributes)")
    if arg_count not in (3, 4):
        raise ConfigError("@user_step_decorator can only decorate generator functions with 3 or 4 arguments "
                          "(step_name, flow, inputs [, attributes])")

    class WrapClass(UserStepDecorator):
        _decorator_name = f"{obj.__module__}.{obj.__name__}"

        def init(self, *a: Any, **kw: Any) -> None:
            if a:
                raise ConfigError(f"{self} does not allow arguments, only keyword arguments")
            self._kwargs = kw

        def pre_step(self, step_name: str, flow: Any, inputs: Any = None) -> Any:
            call = (step_name, flow, inputs, self._kwargs) if arg_count == 4 else (step_name, flow, inputs)
            self._gen = obj(*call)
            v = self._gen.send(None)
            if isinstance(v, dict):
                self.skip_step = v or True
                return None
            return v

        def post_step(self, step_name: str, flow: Any, exception: BaseException | None = None) -> Any:
            try:
                if exception:
                    self._gen.throw(exception)
                else:
                    self._gen.send(None)
            except StopIteration as e:
                return e.value
            except Exception as e:  # noqa: BLE001 - the generator's own exception, or the step's re-raised
                return e
            return None, None, ConfigError(f"{self} should only yield once")

    WrapClass.__name__ = WrapClass.__qualname__ = obj.__name__
    WrapClass.__module__ = obj.__module__
    WrapClass.__doc__ = obj.__doc__
    return WrapClass


class StepMutator(UserStepDecoratorBase):
    """Derive from this class to change a step's decorators from code: `pre_mutate(mutable_step)` once the
    Config values are known (it may add or remove step mutators too), `mutate(mutable_step)` after the command
    line's `--with` decorators are attached. `init(*args, **kwargs)` takes its arguments."""

    _step_field = "config_decorators"
    _allowed_args = True
    _allowed_kwargs = True

    def pre_mutate(self, mutable_step: Any) -> None:
        return None

    def mutate(self, mutable_step: Any) -> None:
        return None

    def add_to_package(self) -> list:
        return []


class FlowMutatorMeta(_Meta):
    _registry = _Registry()
    _base_names = ("FlowMutator",)

    def __str__(cls) -> str:
        return f"FlowMutator({cls.decorator_name})"


class FlowMutator(_Initable, metaclass=FlowMutatorMeta):
    """Derive from this class to change a flow from code: `pre_mutate(mutable_flow)` once the Config values are
    known (add or remove parameters and flow decorators, change steps), `mutate(mutable_flow)` later (change
    steps only). Applied to the FlowSpec class: `@MyMutator` or `@MyMutator(args)`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._flow_cls: type | None = None
        self.statically_defined = True
        self.inserted_by: Any = None
        self._args, self._kwargs, self._ran_init = args, kwargs, False
        if args and (isinstance(args[0], FlowMutator) or _is_flow_class(args[0])):
            self._set_flow_cls(args[0]._flow_cls if isinstance(args[0], FlowMutator) else args[0])
            self._args = args[1:]

    def __mro_entries__(self, bases: tuple) -> tuple:  # `class Child(DecoratedFlow)` with a bare `@MyMutator`
        return (self._flow_cls,)

    def __call__(self, flow_spec: Any = None) -> Any:
        if flow_spec is not None:
            return self._set_flow_cls(flow_spec._flow_cls if isinstance(flow_spec, FlowMutator) else flow_spec)
        if self._flow_cls is None:
            raise ConfigError("a FlowMutator can only be applied to a FlowSpec class")
        return self._flow_cls()  # `MyFlow()` at the bottom of the file, MyFlow being a bare `@MyMutator`'s result

    def _set_flow_cls(self, flow_cls: type) -> type:
        if not _is_flow_class(flow_cls):
            raise ConfigError(f"{self} can only be applied to a FlowSpec class, got {flow_cls!r}")
        flow_cls._stoker_flow_mutators = (*flow_cls.__dict__.get("_stoker_flow_mutators", ()), self)
        self._flow_cls = flow_cls
        return flow_cls

    @classmethod
    def parse_decorator_spec(cls, deco_spec: str) -> FlowMutator:
        _, args, kwargs = parse_decospec(":" + deco_spec if deco_spec else "")
        return cls(*args, **kwargs)

    def pre_mutate(self, mutable_flow: Any) -> None:
        return None

    def mutate(self, mutable_flow: Any) -> None:
        return None

    def add_to_package(self) -> list:
        return []


def _is_flow_class(obj: Any) -> bool:
    return isinstance(obj, type) and hasattr(obj, "_run_inputs") and hasattr(obj, "next")


def flow_mutators(flow_cls: type) -> list[FlowMutator]:
    """The FlowMutators of a flow class, its bases' first (as applied, bottom decorator first)."""
    out: list[FlowMutator] = []
    for klass in reversed(flow_cls.__mro__):
        out.extend(m for m in klass.__dict__.get("_stoker_flow_mutators", ()) if m not in out)
    return out


def flow_class_of(obj: Any) -> type | None:
    """The FlowSpec class `obj` is: the class itself, or the flow a bare `@MyMutator` left in its place."""
    if isinstance(obj, FlowMutator):
        return obj._flow_cls
    return obj if _is_flow_class(obj) else None


def unwrap_step_attributes(flow_cls: type) -> None:
    """A bare `@MyDecorator` leaves its instance as the class attribute: put the step function back (as
    Metaflow does once its mutators ran), so that the class's steps are plain functions."""
    for name, value in list(vars(flow_cls).items()):
        if isinstance(value, UserStepDecoratorBase) and value._my_step is not None:
            setattr(flow_cls, name, value._my_step)


__all__ = ["USER_SKIP_STEP", "FlowMutator", "StepMutator", "UserStepDecorator", "UserStepDecoratorBase",
           "flow_class_of", "flow_mutators", "parse_decospec", "unwrap_step_attributes", "user_step_decorator"]
