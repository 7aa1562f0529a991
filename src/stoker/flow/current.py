"""`current`: what a running task knows about itself (flow, run, step, task, retry, gang position)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ParallelInfo:
    """A gang node's view of its gang (`current.parallel`)."""

    main_ip: str = "127.0.0.1"
    num_nodes: int = 1
    node_index: int = 0
    control_task_id: str | None = None
    port: int | None = None


class Current:
    """Attributes are set by the task entrypoint; outside a task `is_running_flow` is False."""

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}

    def _set(self, **values: Any) -> None:
        self._values.update(values)

    def _clear(self) -> None:
        self._values.clear()

    def get(self, name: str, default: Any = None) -> Any:
        return self._values.get(name, default)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        values = self.__dict__.get("_values", {})
        if name in values:
            return values[name]
        if name in _DEFAULTS:
            return _DEFAULTS[name]() if callable(_DEFAULTS[name]) else _DEFAULTS[name]
        raise AttributeError(f"current has no attribute {name!r} (outside a running task, only "
                             f"is_running_flow is set)")

    @property
    def pathspec(self) -> str | None:
        v = self._values
        if not v:
            return None
        return "/".join(str(v[k]) for k in ("flow_name", "run_id", "step_name", "task_id"))

    @property
    def is_running_flow(self) -> bool:
        return bool(self._values.get("is_running_flow"))

    def __repr__(self) -> str:
        return f"current({self.pathspec or 'not in a task'})"


_DEFAULTS: dict[str, Any] = {
    "username": lambda: os.environ.get("USER") or os.environ.get("USERNAME") or "unknown",
    "origin_run_id": None,
    "retry_count": 0,
    "parallel": ParallelInfo(),
    "tags": (),
    "is_production": False,
}

current = Current()
