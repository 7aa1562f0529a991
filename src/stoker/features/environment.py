"""`@environment(vars={...})`: environment variables of the step's task, set before the step runs."""

from __future__ import annotations

import os

from stoker.errors import ConfigError
from stoker.flow.decorators import StepDecorator, TaskContext, make_step_decorator
from stoker.redact import REDACTED


class EnvironmentDecorator(StepDecorator):
    name = "environment"
    defaults = {"vars": {}}
    order = 5  # first: what the other decorators start (torchrun's ranks, samplers) sees the variables

    def validate(self) -> None:
        if not isinstance(self.attributes["vars"], dict):
            raise ConfigError("@environment(vars=...) takes a dict of environment variables")
        self.attributes["vars"] = {str(k): str(v) for k, v in self.attributes["vars"].items()}

    def task_started(self, ctx: TaskContext) -> None:
        os.environ.update(self.attributes["vars"])

    def __repr__(self) -> str:  # printed by `show`: the names of the variables, never their values
        names = self.attributes["vars"] if isinstance(self.attributes["vars"], dict) else {}
        return f"@environment({', '.join([f'vars={ {k: REDACTED for k in names} !r}', *self._unpacked()])})"


environment = make_step_decorator(EnvironmentDecorator)
