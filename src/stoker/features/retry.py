"""`@retry(times=3, minutes_between_retries=2)`: a failed task runs again, up to `times` more attempts.

The run counts the attempts (`retries`); before a remote attempt (Slurm, Batch) it waits `retry_delay_s`, while a
local one starts at once, as in Metaflow (whose local runtime ignores `minutes_between_retries`); a gang is
retried as a whole.
A preemption is retried without counting against `times`, and a permanent error is never retried
(runtime/driver/failures.py).
"""

from __future__ import annotations

from stoker.flow.decorators import StepDecorator, make_step_decorator


class RetryDecorator(StepDecorator):
    name = "retry"
    defaults = {"times": 3, "minutes_between_retries": 2}

    def validate(self) -> None:
        self._number("times")
        self._number("minutes_between_retries", kind=float)

    def retries(self) -> int:
        return int(self.attributes["times"])

    def retry_delay_s(self) -> float:
        return 60 * float(self.attributes["minutes_between_retries"])


retry = make_step_decorator(RetryDecorator)
