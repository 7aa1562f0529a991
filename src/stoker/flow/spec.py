"""FlowSpec: a flow is a class whose @step methods call `self.next(...)`; attributes set in a step are artifacts.

In a task, artifacts of the parent task are loaded lazily on first access (`self.x`); everything assigned in
the step is persisted when it ends. As in Metaflow, an inherited artifact the step read is the step's own: changed
in place (`self.d["k"] = v`, `self.l.append(x)`), it is stored again (the task compares it with what it loaded,
see `_read_inherited`); one the step never read is passed on by reference, unloaded.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from stoker.errors import StokerError
from stoker.flow.frames import ForeachFrame
from stoker.flow.parameters import Config, Parameter
from stoker.flow.user_decorators import unwrap_step_attributes

# What `MyFlow()` at the bottom of a flow file does with its class: the innermost `flow_entry(...)` of this
# process (a remote node runs the task; `stoker image` takes the class), else the command line that
# stoker/__init__.py installs (`install_cli`: flow/ must not import cli/).
_entries: list[Callable[[type], Any]] = []
_cli: list[Callable[[type], Any]] = []


def install_cli(run_cli: Callable[[type], Any]) -> None:
    """The `python flow.py ...` command line, run by `MyFlow()` outside any `flow_entry`."""
    _cli[:] = [run_cli]


@contextmanager
def flow_entry(entry: Callable[[type], Any]) -> Iterator[None]:
    """While the block runs (a flow file run as __main__), `MyFlow()` calls `entry(MyFlow)` instead of the CLI."""
    _entries.append(entry)
    try:
        yield
    finally:
        _entries.remove(entry)

_INTERNAL = {"_inherited", "_loader", "_loaded", "_transition", "_foreach", "_graph_step", "_run_inputs",
             "_stoker_run_input_names", "_is_join"}
# FlowSpec attributes that are not class-level constants (as Metaflow's FlowSpec._NON_PARAMETERS)
_NON_PARAMETERS = {"cmd", "foreach_stack", "index", "input", "script_name", "name"}
READ_ONLY = "Flow level attributes and Parameters are not modifiable"  # Metaflow's message


class MergeArtifactsError(StokerError):
    """merge_artifacts was called where it cannot merge (outside a join, or with include= and exclude=)."""


class UnhandledInMergeArtifactsException(MergeArtifactsError):
    """merge_artifacts found artifacts with different values in different branches (Metaflow's name)."""

    def __init__(self, msg: str, unhandled: list[str]) -> None:
        super().__init__(msg)
        self.artifact_names = unhandled


class MissingInMergeArtifactsException(MergeArtifactsError):
    """merge_artifacts(include=...) names artifacts no branch has (Metaflow's name)."""

    def __init__(self, msg: str, missing: list[str]) -> None:
        super().__init__(msg)
        self.artifact_names = missing


def artifact_identity(desc: dict) -> str:
    """What makes two stored artifacts equal: their content, not their repr."""
    return json.dumps({k: v for k, v in desc.items() if k not in ("repr", "summary")}, sort_keys=True, default=str)


class _ArtifactView:
    """Lazy attribute access to one task's artifacts (used for `self` and for each join input)."""

    def __init__(self, inherited: dict[str, dict], loader: Callable[[dict, str], Any], step: str = "",
                 foreach: list[ForeachFrame] | None = None) -> None:
        object.__setattr__(self, "_foreach", foreach or [])
        object.__setattr__(self, "_inherited", dict(inherited))
        object.__setattr__(self, "_loader", loader)
        object.__setattr__(self, "_loaded", {})
        object.__setattr__(self, "_step", step)

    def _load(self, name: str) -> Any:
        loaded = self.__dict__["_loaded"]
        if name not in loaded:
            loaded[name] = self.__dict__["_loader"](self.__dict__["_inherited"][name], name)
        return loaded[name]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name in self.__dict__.get("_inherited", {}):
            return self._load(name)
        raise AttributeError(f"step {self.__dict__.get('_step')!r} has no artifact {name!r}")

    def __contains__(self, name: str) -> bool:
        return name in self.__dict__["_inherited"]

    # a join input is a view of one parent task, with its foreach position as in Metaflow
    input = property(lambda self: FlowSpec.input.fget(self))
    index = property(lambda self: FlowSpec.index.fget(self))

    def foreach_stack(self) -> list[tuple[int, int | None, Any]]:
        return FlowSpec.foreach_stack(self)  # type: ignore[arg-type]


class Inputs:
    """The `inputs` of a join: iterate over the branches, index them, or name a static branch (`inputs.a`)."""

    def __init__(self, views: list[_ArtifactView]) -> None:
        self._views = views
        self._by_step = {v.__dict__["_step"]: v for v in views}

    def __iter__(self) -> Iterator[_ArtifactView]:
        return iter(self._views)

    def __len__(self) -> int:
        return len(self._views)

    def __getitem__(self, i: int) -> _ArtifactView:
        return self._views[i]

    def __getattr__(self, name: str) -> _ArtifactView:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._by_step[name]
        except KeyError:
            raise AttributeError(f"this join has no input from step {name!r}; inputs come from "
                                 f"{sorted(self._by_step)}") from None


class FlowSpec:
    """Base class of flows. `MyFlow()` at the bottom of a flow file runs its command line."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        unwrap_step_attributes(cls)  # a bare `@MyUserDecorator` above `@step` leaves its object in the class

    def __init__(self, use_cli: bool = True) -> None:
        if use_cli:
            entry = (_entries or _cli or [None])[-1]
            if entry is None:  # pragma: no cover - stoker/__init__ installs the CLI
                raise RuntimeError("import FlowSpec from stoker, not stoker.flow.spec, to run a flow")
            entry(type(self))

    @classmethod
    def _task_instance(cls, inherited: dict[str, dict], loader: Callable[[dict, str], Any],
                       step: str, foreach: list[ForeachFrame] | None = None, is_join: bool | None = None) -> FlowSpec:
        """A FlowSpec for one task: artifacts of its parent(s) load on first access (`is_join`: whether the step
        is a join, for merge_artifacts; None when unknown)."""
        self = cls.__new__(cls)
        d = self.__dict__
        d["_inherited"] = dict(inherited)
        d["_loader"] = loader
        d["_loaded"] = {}
        d["_transition"] = None
        d["_foreach"] = foreach or []
        d["_graph_step"] = step
        d["_is_join"] = is_join
        return self

    @classmethod
    def _constant_names(cls) -> frozenset[str]:
        """Class-level constants (as Metaflow: public class attributes that are not Parameters, methods,
        properties or classes); a step cannot assign them."""
        import types

        cached = cls.__dict__.get("_stoker_constant_names")
        if cached is None:
            inputs = cls._run_input_names()
            names = set()
            for var in dir(cls):
                if var[0] == "_" or var in _NON_PARAMETERS or var in inputs:
                    continue
                try:
                    val = getattr(cls, var)
                except Exception:  # noqa: BLE001 - a descriptor that fails on the class is no constant
                    continue
                if not isinstance(val, (types.MethodType, types.FunctionType, property, type, classmethod,
                                        staticmethod)) and not getattr(val, "is_step", False):
                    names.add(var)
            cached = frozenset(names)
            cls._stoker_constant_names = cached
        return cached

    @classmethod
    def _run_input_names(cls) -> frozenset[str]:
        """Names of the Parameters and Configs (kept after the task turns them into properties)."""
        cached = cls.__dict__.get("_stoker_run_input_names")
        if cached is None:
            cached = frozenset(cls._run_inputs())
            cls._stoker_run_input_names = cached
        return cached

    @classmethod
    def _run_inputs(cls) -> dict[str, Parameter | Config]:
        out: dict[str, Parameter | Config] = {}
        for klass in reversed(cls.__mro__):
            for attr, v in vars(klass).items():
                if isinstance(v, (Parameter, Config)):
                    out[attr] = v
        return out

    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    def script_name(self) -> str:
        import inspect
        import os

        return os.path.basename(inspect.getfile(type(self)))

    @property
    def _graph_info(self) -> dict[str, Any]:
        """Metaflow's `FlowSpec._graph_info` in a task (what `current.graph` gives): a docs example prints it."""
        from stoker.flow.current import current

        return current.graph

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        if name.startswith("__") or "_inherited" not in d:
            raise AttributeError(name)
        if name in d["_loaded"]:
            return d["_loaded"][name]
        if name in d["_inherited"]:
            v = d["_loader"](d["_inherited"][name], name)
            d["_loaded"][name] = v
            return v
        raise AttributeError(f"step {d.get('_graph_step')!r} has no artifact {name!r}: assign self.{name} in this "
                             f"or an earlier step (a join must use merge_artifacts or read inputs)")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in type(self)._run_input_names():
            raise AttributeError(f"{READ_ONLY}: {name} is a run input (Parameter/Config) and is read-only in a step")
        if name in type(self)._constant_names():
            raise AttributeError(f"{READ_ONLY}: {name} is a class-level constant of {type(self).__name__}; "
                                 "assign the changed value to another artifact name")
        if name in ("next", "input", "index", "merge_artifacts", "foreach_stack"):
            raise AttributeError(f"{name!r} is reserved by FlowSpec; choose another artifact name")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        """As in Metaflow, `del self.x` drops this step's value of `x` (assigned, or read and maybe changed in
        place): an inherited `x` is passed on as the parent stored it, and reading `self.x` again loads that."""
        d = self.__dict__
        if name in d:
            object.__delattr__(self, name)
        d.get("_loaded", {}).pop(name, None)

    # -- transitions -------------------------------------------------------------------------------
    def next(self, *dsts: Callable | dict, foreach: str | None = None, num_parallel: int | None = None,
             condition: str | None = None) -> None:
        """Go to the next step(s): one step, a static split, `foreach="attr"`, a gang of `num_parallel`, or a
        switch, `self.next({"a": self.a, "b": self.b}, condition="attr")`: the case named by `self.attr` runs."""
        step = self.__dict__.get("_graph_step")
        if self.__dict__.get("_transition") is not None:
            raise StokerError(f"self.next() was called twice in step {step}")
        if condition is not None or (len(dsts) == 1 and isinstance(dsts[0], dict)):
            self.__dict__["_transition"] = _switch_target(self, step, dsts, condition, foreach, num_parallel)
            return
        names = []
        for d in dsts:
            n = getattr(d, "__name__", None)
            if n is None or not getattr(d, "is_step", False):
                raise StokerError(f"self.next() takes steps (self.<step>), got {d!r}")
            names.append(n)
        self.__dict__["_transition"] = {"steps": names, "foreach": foreach, "num_parallel": num_parallel}

    # -- foreach ----------------------------------------------------------------------------------
    @property
    def input(self) -> Any:
        """The foreach item this task handles (innermost foreach)."""
        fe: list[ForeachFrame] = self.__dict__.get("_foreach") or []
        return fe[-1].value() if fe else None

    @property
    def index(self) -> int | None:
        fe: list[ForeachFrame] = self.__dict__.get("_foreach") or []
        return fe[-1].index if fe else None

    def foreach_stack(self) -> list[tuple[int, int | None, Any]]:
        """(index, num_splits, value) of every enclosing foreach, outermost first (a gang node: no num_splits)."""
        return [f.stack_entry() for f in self.__dict__.get("_foreach") or []]

    # -- joins ------------------------------------------------------------------------------------
    def merge_artifacts(self, inputs: Iterable, exclude: Iterable[str] | None = None,
                        include: Iterable[str] | None = None) -> None:
        """Carry over artifacts that are equal in every branch (or set in only one), as Metaflow does.

        Only in a join; artifacts already set in this step are left alone. A conflict (or, with include=, a
        name no branch has) raises and sets nothing."""
        include_l, exclude_l = list(include or ()), list(exclude or ())
        d = self.__dict__
        step = d.get("_graph_step")
        if d.get("_is_join") is False:
            raise MergeArtifactsError(f"merge_artifacts can only be called in a join and step *{step}* is not a "
                                      "join")
        if include_l and exclude_l:
            raise MergeArtifactsError("`exclude` and `include` are mutually exclusive in merge_artifacts")
        to_merge: dict[str, dict] = {}
        unresolved: list[str] = []
        for view in inputs:
            for name, desc in view.__dict__["_inherited"].items():
                if (name not in include_l) if include_l else (name in exclude_l or name in _INTERNAL):
                    continue
                if self._has(name):
                    continue
                first = to_merge.setdefault(name, desc)
                if first is not desc and artifact_identity(first) != artifact_identity(desc) \
                        and name not in unresolved:
                    unresolved.append(name)
        missing = [v for v in include_l if v not in to_merge and not self._has(v)]
        if unresolved:  # nothing is set
            raise UnhandledInMergeArtifactsException(
                f"Step *{step}* cannot merge the following artifacts due to them having conflicting values:\n"
                f"[{', '.join(unresolved)}].\nTo remedy this issue, be sure to explicitly set those artifacts "
                "(using self.<artifact_name> = ...) prior to calling merge_artifacts.", unresolved)
        if missing:
            raise MissingInMergeArtifactsException(
                f"Step *{step}* specifies that [{', '.join(include_l)}] should be merged but "
                f"[{', '.join(missing)}] are not present.\nTo remedy this issue, make sure that the values "
                "specified in only come from at least one branch", missing)
        for name, desc in to_merge.items():
            d["_inherited"][name] = desc
            d["_loaded"].pop(name, None)

    def _has(self, name: str) -> bool:
        """`hasattr(self, name)` without loading an artifact: set in this step, inherited, or on the class."""
        d = self.__dict__
        return name in d or name in d["_inherited"] or hasattr(type(self), name)

    def _read_inherited(self) -> dict[str, tuple[Any, dict]]:
        """Inherited artifacts this step read and neither assigned nor deleted: name -> (the value now, the descriptor
        it was loaded from). The task stores again those changed in place, as Metaflow, which stores every artifact
        a step read (its FlowSpec.__getattr__ caches a loaded artifact on the flow, and TaskDataStore.persist saves
        the flow's attributes). Run inputs (read-only properties) are not artifacts of a step."""
        d = self.__dict__
        run_inputs = type(self)._run_input_names()
        return {name: (value, d["_inherited"][name]) for name, value in d["_loaded"].items()
                if name not in d and name in d["_inherited"] and name not in run_inputs}

    def _new_artifacts(self) -> dict[str, Any]:
        """What the step assigned (as in Metaflow, `_private` names too; `__dunder__` names never)."""
        return {k: v for k, v in self.__dict__.items() if not k.startswith("__") and k not in _INTERNAL}


def _switch_target(flow: FlowSpec, step: str | None, dsts: tuple, condition: str | None, foreach: Any,
                   num_parallel: Any) -> dict[str, Any]:
    """The case a switch takes (Metaflow's checks and messages)."""
    if condition is None:
        raise StokerError(f"step {step}: a dictionary in self.next() needs condition=: "
                          f'self.next({{"a": self.a, "b": self.b}}, condition="artifact")')
    if len(dsts) != 1 or not isinstance(dsts[0], dict) or not dsts[0]:
        raise StokerError(f"step {step}: with condition=, self.next() takes one non-empty dictionary that maps "
                          f"condition values to steps")
    if not isinstance(condition, str):
        raise StokerError(f"step {step}: condition= takes the name of an artifact as a string")
    if foreach is not None or num_parallel is not None:
        raise StokerError(f"step {step}: a switch (condition=) cannot be combined with foreach= or num_parallel=")
    try:
        value = getattr(flow, condition)
    except AttributeError:
        raise StokerError(f"condition variable self.{condition} in step {step} does not exist: set "
                          f"self.{condition} in this step (or an earlier one)") from None
    cases = dsts[0]
    try:
        chosen = cases[value]
    except (KeyError, TypeError):
        raise RuntimeError(f"Switch condition variable '{condition}' has value '{value}' which is not in the "
                           f"available cases: {list(cases)}") from None
    n = getattr(chosen, "__name__", None)
    if n is None or not getattr(chosen, "is_step", False):
        raise StokerError(f"step {step}: the switch case {value!r} goes to {chosen!r}, which is not a step")
    return {"steps": [n], "foreach": None, "num_parallel": None, "condition": condition}
