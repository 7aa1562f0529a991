"""`@monitor(interval=1, gpu=None, neuron=None)` and `@neuron_monitor`: sample the task's node into the store.

CPU% and RSS of the task's process tree, host memory, GPUs through NVML and NeuronCores through neuron-monitor
(stoker.monitor), every `interval` s while the step runs; at the end the last samples are written and the
"monitor" card drawn. In a gang every node samples its own node into its own series
(`.../monitor/<step>/<task>/<attempt>/<node>/`). Nothing here can fail the task: when the monitor cannot start,
one warning is printed and the step runs as is.
"""

from __future__ import annotations

import logging

from stoker.errors import ConfigError
from stoker.flow.decorators import StepDecorator, TaskContext, make_step_decorator

log = logging.getLogger(__name__)


class MonitorDecorator(StepDecorator):
    """Samples the task's node every `interval` s into the store: CPU% and RSS of the task's process tree, host
    memory, GPUs through NVML and NeuronCores through neuron-monitor. `gpu` / `neuron`: True wants them (one
    warning when the tool is missing), None (default) uses them when the node has such devices, False skips."""

    name = "monitor"
    defaults = {"interval": 1, "gpu": None, "neuron": None}
    order = 40  # started before the cards, stopped after them

    def validate(self) -> None:
        self._number("interval", minimum=0.05, kind=float)
        for k in ("gpu", "neuron"):
            if self.attributes[k] not in (None, True, False):
                raise ConfigError(f"@{self.name}({k}={self.attributes[k]!r}): use True, False or None (auto)")

    def task_started(self, ctx: TaskContext) -> None:
        if "monitor" in ctx.state:  # @monitor and @neuron_monitor on one step: one monitor
            return
        s = ctx.spec
        try:
            from stoker.monitor.monitor import Monitor
            from stoker.store.series import series_prefix

            a = self.attributes
            node = ctx.parallel.node_index
            prefix = series_prefix("monitor", s.flow, s.run_id, s.step, s.task_id, s.attempt, node=node)
            ctx.state["monitor"] = Monitor(ctx.store, prefix, interval=a["interval"], node=node, gpu=a.get("gpu"),
                                           neuron=a.get("neuron")).start()
        except Exception as exc:  # noqa: BLE001 - the monitor must never fail the task
            log.warning(f"@{self.name}: could not start ({type(exc).__name__}: {exc}); the step runs without it")
            ctx.state["monitor"] = None

    def task_finished(self, ctx: TaskContext) -> None:
        if "monitor" not in ctx.state:
            return
        m = ctx.state.pop("monitor")
        if m is not None:
            try:
                m.stop()  # the last samples land before the manifest says the attempt is over
            except Exception:  # noqa: BLE001
                log.debug("stopping the monitor failed", exc_info=True)
        try:
            from stoker.cards.monitor_card import write_monitor_card

            s = ctx.spec
            write_monitor_card(ctx.store, s.flow, s.run_id, s.step, s.task_id, s.attempt, final=True)
        except Exception as e:  # noqa: BLE001
            log.warning("@monitor: the monitor card failed (%s: %s)", type(e).__name__, e)


class NeuronMonitorDecorator(MonitorDecorator):
    """Metaflow's name for @monitor on Trainium/Inferentia: NeuronCore sampling is wanted (neuron=True)."""

    name = "neuron_monitor"
    defaults = {"interval": 1, "gpu": None, "neuron": True}


monitor = make_step_decorator(MonitorDecorator)
neuron_monitor = make_step_decorator(NeuronMonitorDecorator)
