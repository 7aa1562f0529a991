"""`@timeout(seconds=, minutes=, hours=)`: a limit on one attempt of a step; `@timeout(hang=S)`: a limit on its
silence.

In the task, SIGALRM raises StepTimeout out of the step, so @retry and @catch handle it like any exception.
The run also gives each attempt a deadline a few seconds later (`deadline_s`) and stops a task that is still
running then; a remote backend asks its engine for the same limit (the unit's `timeout_s`).

`hang=` (seconds, alone or with a time limit) is the step's hang timeout: an attempt whose task and ranks print
nothing for that long is stopped with their stacks recorded, cause `hang`, and retried under @retry
(runtime/member/watchdog.py acts on it through the `hang_s` hook; `run --hang-timeout` is the run's default for
gangs and @torchrun steps; docs/operations.md "Stacks and hangs").
"""

from __future__ import annotations

import signal
from typing import Any

from stoker.errors import ConfigError, StokerError
from stoker.flow.decorators import StepCall, StepDecorator, TaskContext, make_step_decorator


class StepTimeout(StokerError):
    """The step ran longer than its @timeout."""


class TimeoutDecorator(StepDecorator):
    name = "timeout"
    defaults = {"seconds": 0, "minutes": 0, "hours": 0, "hang": 0}
    order = 30  # outside @secrets and @catch: their work counts against the limit

    def validate(self) -> None:
        for k in self.defaults:
            self._number(k, kind=float)
        if self.total_seconds <= 0 and self.attributes["hang"] <= 0:
            raise ConfigError("@timeout needs seconds=, minutes=, hours= or hang= greater than 0")

    @property
    def total_seconds(self) -> float:
        a = self.attributes
        return a["seconds"] + 60 * a["minutes"] + 3600 * a["hours"]

    def deadline_s(self) -> float | None:
        return self.total_seconds or None

    def hang_s(self) -> float | None:
        """Seconds without progress after which an attempt is stopped as hung (`hang=`), or None."""
        return float(self.attributes["hang"]) or None

    def task_decorate(self, ctx: TaskContext, call: StepCall) -> StepCall:
        seconds = self.total_seconds
        if not seconds:  # hang= only: the task's watchdog acts on it
            return call

        def timed() -> Any:
            def fire(signum: int, frame: Any) -> None:
                raise StepTimeout(f"step timed out after {seconds:g} s (@timeout); raise the limit or "
                                  f"make the step faster")

            signal.signal(signal.SIGALRM, fire)
            signal.setitimer(signal.ITIMER_REAL, seconds)
            try:
                return call()
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)

        return timed


timeout = make_step_decorator(TimeoutDecorator)
