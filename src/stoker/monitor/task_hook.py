"""The task entrypoint's hook: start a Monitor when the step has @monitor or @neuron_monitor, stop it at the end.

In a gang every node samples its own node into its own series (`.../monitor/<step>/<task>/<attempt>/<node>/`).
Nothing here can fail the task: when the monitor cannot start, one warning is printed and the step runs as is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class MonitorHandle:
    """What `start_for_task` returns; `stop()` writes the last samples and never raises."""

    def __init__(self, monitor: Any = None) -> None:
        self.monitor = monitor

    def stop(self) -> None:
        m, self.monitor = self.monitor, None
        if m is not None:
            try:
                m.stop()
            except Exception:  # noqa: BLE001
                log.debug("stopping the monitor failed", exc_info=True)


def monitor_decorator(func: Callable) -> Any:
    """The step's @monitor or @neuron_monitor, if any."""
    for d in getattr(func, "decorators", []):
        if d.name in ("monitor", "neuron_monitor"):
            return d
    return None


def start_for_task(func: Callable, store: Any, *, flow: str, run_id: str, step: str, task_id: str, attempt: int,
                   node: int = 0) -> MonitorHandle:
    """Start sampling this node for one task attempt when the step asks for it."""
    deco = monitor_decorator(func)
    if deco is None:
        return MonitorHandle()
    try:
        from ..store.series import series_prefix
        from .monitor import Monitor

        a = deco.attributes
        prefix = series_prefix("monitor", flow, run_id, step, task_id, attempt, node=node)
        return MonitorHandle(Monitor(store, prefix, interval=a["interval"], node=node, gpu=a.get("gpu"),
                                     neuron=a.get("neuron")).start())
    except Exception as exc:  # noqa: BLE001 - the monitor must never fail the task
        log.warning(f"@{deco.name}: could not start ({type(exc).__name__}: {exc}); the step runs without it")
        return MonitorHandle()
