"""FlowSpec: a flow is a class whose @step methods call `self.next(...)`; attributes set in a step are artifacts.

In a task, artifacts of the parent task are loaded lazily on first access (`self.x`); everything assigned in
the step is persisted when it ends. A loaded artifact that is mutated in place is not saved again unless it is
assigned (`self.x = self.x`), which keeps large inherited arrays from being re-hashed in every step.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..errors import StokerError
from .parameters import Config, Parameter

# Set by stoker/__init__.py: runs the `python flow.py ...` command line (flow/ must not import cli/).
CLI_HOOK: Callable[[type], Any] | None = None

_INTERNAL = {"_inherited", "_loader", "_loaded", "_transition", "_foreach", "_graph_step", "_run_inputs",
             "_stoker_run_input_names"}


class MergeArtifactsError(StokerError):
    """merge_artifacts found an artifact with different values in different branches."""


def artifact_identity(desc: dict) -> str:
    """What makes two stored artifacts equal: their content, not their repr."""
    return json.dumps({k: v for k, v in desc.items() if k not in ("repr", "summary")}, sort_keys=True, default=str)


class _ArtifactView:
    """Lazy attribute access to one task's artifacts (used for `self` and for each join input)."""

    def __init__(self, inherited: dict[str, dict], loader: Callable[[dict], Any], step: str = "",
                 foreach: list[dict] | None = None) -> None:
        object.__setattr__(self, "_foreach", foreach or [])
        object.__setattr__(self, "_inherited", dict(inherited))
        object.__setattr__(self, "_loader", loader)
        object.__setattr__(self, "_loaded", {})
        object.__setattr__(self, "_step", step)

    def _load(self, name: str) -> Any:
        loaded = self.__dict__["_loaded"]
        if name not in loaded:
            loaded[name] = self.__dict__["_loader"](self.__dict__["_inherited"][name])
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

    def foreach_stack(self) -> list[tuple[int, int, Any]]:
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

    def __init__(self, use_cli: bool = True) -> None:
        if use_cli:
            if CLI_HOOK is None:  # pragma: no cover - stoker/__init__ sets it
                raise RuntimeError("import FlowSpec from stoker, not stoker.flow.spec, to run a flow")
            CLI_HOOK(type(self))

    @classmethod
    def _task_instance(cls, inherited: dict[str, dict], loader: Callable[[dict], Any],
                       step: str, foreach: list[dict] | None = None) -> FlowSpec:
        """A FlowSpec for one task: artifacts of its parent(s) load on first access."""
        self = cls.__new__(cls)
        d = self.__dict__
        d["_inherited"] = dict(inherited)
        d["_loader"] = loader
        d["_loaded"] = {}
        d["_transition"] = None
        d["_foreach"] = foreach or []
        d["_graph_step"] = step
        return self

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

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        if name.startswith("__") or "_inherited" not in d:
            raise AttributeError(name)
        if name in d["_loaded"]:
            return d["_loaded"][name]
        if name in d["_inherited"]:
            v = d["_loader"](d["_inherited"][name])
            d["_loaded"][name] = v
            return v
        raise AttributeError(f"step {d.get('_graph_step')!r} has no artifact {name!r}: assign self.{name} in this "
                             f"or an earlier step (a join must use merge_artifacts or read inputs)")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in type(self)._run_input_names():
            raise AttributeError(f"{name} is a run input (Parameter/Config) and is read-only in a step")
        if name in ("next", "input", "index", "merge_artifacts", "foreach_stack"):
            raise AttributeError(f"{name!r} is reserved by FlowSpec; choose another artifact name")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        d = self.__dict__
        if name in d:
            object.__delattr__(self, name)
        d.get("_inherited", {}).pop(name, None)
        d.get("_loaded", {}).pop(name, None)

    # -- transitions -------------------------------------------------------------------------------
    def next(self, *dsts: Callable, foreach: str | None = None, num_parallel: int | None = None) -> None:
        """Go to the next step(s): one step, a static split, `foreach="attr"` or a gang of `num_parallel`."""
        if self.__dict__.get("_transition") is not None:
            raise StokerError(f"self.next() was called twice in step {self._graph_step}")
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
        fe = self.__dict__.get("_foreach") or []
        if not fe:
            return None
        top = fe[-1]
        if "value_fn" in top:
            return top["value_fn"]()
        return top.get("value")

    @property
    def index(self) -> int | None:
        fe = self.__dict__.get("_foreach") or []
        return fe[-1]["index"] if fe else None

    def foreach_stack(self) -> list[tuple[int, int, Any]]:
        """(index, num_splits, value) of every enclosing foreach, outermost first."""
        return [(f["index"], f["num_splits"], f["value_fn"]() if "value_fn" in f else f.get("value"))
                for f in self.__dict__.get("_foreach") or []]

    # -- joins ------------------------------------------------------------------------------------
    def merge_artifacts(self, inputs: Iterable, exclude: Iterable[str] | None = None,
                        include: Iterable[str] | None = None) -> None:
        """Carry over artifacts that are equal in every branch (or set in only one); conflicts are errors."""
        exclude, include = set(exclude or ()), set(include or ())
        if exclude and include:
            raise MergeArtifactsError("merge_artifacts takes exclude= or include=, not both")
        seen: dict[str, list[tuple[str, dict]]] = {}
        for view in inputs:
            for name, desc in view.__dict__["_inherited"].items():
                seen.setdefault(name, []).append((view.__dict__["_step"], desc))
        d = self.__dict__
        conflicts = []
        for name, descs in seen.items():
            if name in exclude or (include and name not in include) or name in d or name in _INTERNAL:
                continue
            if name in type(self)._run_input_names():
                continue
            if len({artifact_identity(x) for _, x in descs}) > 1:
                conflicts.append(name)
                continue
            d["_inherited"][name] = descs[0][1]
            d["_loaded"].pop(name, None)
        missing = include - set(seen)
        if missing:
            raise MergeArtifactsError(f"merge_artifacts(include=...) names artifacts no input has: "
                                      f"{', '.join(sorted(missing))}")
        if conflicts:
            raise MergeArtifactsError(
                f"merge_artifacts: {', '.join(sorted(conflicts))} differ between branches; assign them in the join "
                f"(e.g. self.{conflicts[0]} = max(i.{conflicts[0]} for i in inputs)) or pass exclude=[...]")

    def _new_artifacts(self) -> dict[str, Any]:
        """What the step assigned (as in Metaflow, `_private` names too; `__dunder__` names never)."""
        return {k: v for k, v in self.__dict__.items() if not k.startswith("__") and k not in _INTERNAL}
