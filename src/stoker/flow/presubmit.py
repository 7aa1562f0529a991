"""`@presubmit`: a method of the flow that refuses, before anything is submitted, a run that cannot work.

    class Train(FlowSpec):
        nodes = Parameter("nodes", default=4, type=int)

        @presubmit
        def plan(self):
            check(my_plan(nodes=self.nodes, ...), "Train")   # raise ConfigError with the fix

The run calls it once its inputs are resolved, before anything is registered or submitted, and `run --dry-run`
calls it too (runtime/driver/launch.py `check_units`), so a dry run refuses what the run would. `self` there is not
a task's flow: it has the run's Parameters and Configs (`self.nodes`, `self.config`) and the flow's methods, but no
artifacts and no `current` of a task. A stoker-only decorator: Metaflow has no such hook.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any


def presubmit(func: Callable) -> Callable:
    """Mark a FlowSpec method as a pre-submit check (see the module doc)."""
    func.is_presubmit = True  # type: ignore[attr-defined]
    return func


class RunInputs:
    """The `self` of a @presubmit method: the run's inputs by attribute, the flow class's methods bound to it."""

    def __init__(self, flow_cls: type, values: dict[str, Any]) -> None:
        object.__setattr__(self, "_flow_cls", flow_cls)
        object.__setattr__(self, "_values", values)

    def __getattr__(self, name: str) -> Any:
        values = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        attr = inspect.getattr_static(object.__getattribute__(self, "_flow_cls"), name)
        if inspect.isfunction(attr):
            return attr.__get__(self)
        if isinstance(attr, (staticmethod, classmethod)):
            return attr.__get__(self, object.__getattribute__(self, "_flow_cls"))
        if getattr(attr, "IS_RUN_INPUT", False):
            raise AttributeError(f"{name}: the run has no value for it here")
        return attr

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"self.{name} = ...: a @presubmit check sees the run's inputs, it sets no artifacts "
                             f"(set them in the start step)")


def run_presubmit_checks(flow_cls: type, values: dict[str, Any]) -> None:
    """Call every @presubmit method of `flow_cls` with the run's inputs (`values`, by attribute)."""
    for name in dir(flow_cls):
        func = inspect.getattr_static(flow_cls, name, None)
        if inspect.isfunction(func) and getattr(func, "is_presubmit", False):
            func(RunInputs(flow_cls, values))
