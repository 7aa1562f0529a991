"""Metaflow 2.19's mutators: a StepMutator that adds @retry to every step (one step fails once), a FlowMutator
that adds the StepMutator, a Parameter and an @environment to every step, reading a Config."""

import os

from metaflow import Config, FlowMutator, FlowSpec, Parameter, StepMutator, current, environment, retry, step


class AddRetry(StepMutator):
    def init(self, *args, **kwargs):
        self.times = kwargs.get("times", 1)

    def mutate(self, mutable_step):
        mutable_step.add_decorator(retry, deco_kwargs={"times": self.times, "minutes_between_retries": 0})
        mutable_step.add_decorator("retry:times=5")  # ignored: the step has a @retry now (duplicates=IGNORE)


class EveryStep(FlowMutator):
    def pre_mutate(self, mutable_flow):
        settings = dict(mutable_flow.configs)["settings"]
        mutable_flow.add_parameter("added", Parameter("added", default=settings.added_default, type=int))
        for _name, s in mutable_flow.steps:
            s.add_decorator(AddRetry, deco_kwargs={"times": 2})

    def mutate(self, mutable_flow):
        for name, s in mutable_flow.steps:
            names = sorted(n for n, _, _, _ in s.decorator_specs)
            s.add_decorator(environment, deco_kwargs={"vars": {"MUTATED": name, "SPECS": ",".join(names)}})


@EveryStep
class MutatorsFlow(FlowSpec):
    settings = Config("settings", default_value={"added_default": 5})

    @step
    def start(self):
        self.start_env = os.environ.get("MUTATED")
        self.next(self.flaky)

    @step
    def flaky(self):
        self.attempt = current.retry_count
        if current.retry_count == 0:
            raise RuntimeError("fails once")
        self.specs = os.environ.get("SPECS")
        self.next(self.end)

    @step
    def end(self):
        self.end_env = os.environ.get("MUTATED")
        self.added_value = self.added


if __name__ == "__main__":
    MutatorsFlow()
