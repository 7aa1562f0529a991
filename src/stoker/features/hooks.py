"""The engine's side of the decorator hooks (flow.decorators.StepDecorator): it calls them for whatever
decorators a step and its flow have, and knows none of them by name.

Task side, `TaskHooks` (runtime/member/task.py): started -> decorate the step's call -> post_step | exception ->
finished. Driver side, functions of the step function (runtime/driver/scheduler.py, runtime/driver/jobs.py): how
many attempts, how long between them, an attempt's deadline, fallback attempts, the resources a node asks for,
what refuses a plan before the run starts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stoker.flow.decorators import StepCall, StepDecorator, TaskContext, task_decorators

_EVERY_TASK: list[StepDecorator] = []


def every_task(hook: StepDecorator) -> StepDecorator:
    """Run `hook`'s task-side hooks in every task, as if every step had it (what `current` always offers, such as
    `current.card`)."""
    _EVERY_TASK.append(hook)
    return hook


class TaskHooks:
    """The task-side hooks of one attempt, in the decorators' `order` (finished: in reverse)."""

    def __init__(self, ctx: TaskContext) -> None:
        self.ctx = ctx
        decos = task_decorators(ctx.flow_cls, ctx.func)
        self.decorators = sorted([*decos, *_EVERY_TASK], key=lambda d: d.order)

    def started(self) -> None:
        for d in self.decorators:
            d.task_started(self.ctx)

    def decorate(self, call: StepCall) -> StepCall:
        for d in self.decorators:  # the first wraps the step itself, the last is the outermost
            call = d.task_decorate(self.ctx, call)
        return call

    def post_step(self) -> None:
        for d in self.decorators:
            d.task_post_step(self.ctx)

    def exception(self, exc: BaseException) -> bool:
        """Whether a decorator handled the step's exception (the first that does; the others are not asked)."""
        return any(d.task_exception(self.ctx, exc) for d in self.decorators)

    def finished(self) -> None:
        for d in reversed(self.decorators):
            d.task_finished(self.ctx)


def _decorators(func: Callable) -> list[StepDecorator]:
    return list(getattr(func, "decorators", []))


def attempts_allowed(func: Callable) -> int:
    """The first attempt and the step's retries."""
    return 1 + sum(d.retries() for d in _decorators(func))


def attempt_delay_s(func: Callable) -> float:
    """Seconds to wait before the step's next attempt."""
    return max((d.retry_delay_s() for d in _decorators(func)), default=0.0)


def deadline(func: Callable) -> tuple[float, str] | None:
    """(seconds, why) of the tightest limit on one attempt of the step, or None."""
    limits = [(s, f"it exceeded its @{d.name}") for d in _decorators(func) if (s := d.deadline_s()) is not None]
    return min(limits, key=lambda x: x[0]) if limits else None


def hang_limit_s(func: Callable) -> float | None:
    """Seconds without progress (no output from the task or its ranks) after which an attempt of the step is stopped
    as hung, as the step's decorators set it (`hang_s`); None: the run's default (runtime/member/watchdog.py)."""
    found = [s for d in _decorators(func) if (s := getattr(d, "hang_s", lambda: None)()) is not None]
    return min(found) if found else None


def fallback_attempts(func: Callable, node_kind: str) -> tuple[int, str]:
    """(attempts, the note the run prints) that record a failure once the step's own attempts are spent."""
    found = [(n, d.fallback_note) for d in _decorators(func) if (n := d.fallback_attempts(node_kind)) > 0]
    return max(found, key=lambda x: x[0]) if found else (0, "")


def resources_request(func: Callable) -> dict[str, Any]:
    """Per-node resources the step asks for (the keys that are set)."""
    out: dict[str, Any] = {}
    for d in _decorators(func):
        out.update(d.resources_request())
    return out


def backend_options(func: Callable, engine: str | None = None) -> dict[str, Any]:
    """The arguments of the step's backend decorator (`@slurm(...)`, `@batch(...)`: the one with an `engine`; with
    `engine`, the one for that backend)."""
    d = next((d for d in _decorators(func) if d.engine and engine in (None, d.engine)), None)
    return dict(d.attributes) if d else {}


def gang_spares(func: Callable) -> int:
    """Hot spares the gang step asks for beside its nodes (0: none; distributed/gangboard.py)."""
    return max((d.spares() for d in _decorators(func)), default=0)


def plan_problems(func: Callable, resources: dict[str, Any], options: dict[str, Any]) -> list[str]:
    """Why the step cannot run as planned on a node with `resources` and backend `options` (empty: it can)."""
    return [p for d in _decorators(func) if (p := d.plan_problem(resources, options))]


def preload(flow_cls: type | None = None) -> None:
    """Import what the hooks of every task import on first use (a fork server does it once, before it forks):
    what the tasks of `flow_cls` use (None: what any task may)."""
    for hook in _EVERY_TASK:
        if hasattr(hook, "preload"):
            hook.preload(flow_cls)
