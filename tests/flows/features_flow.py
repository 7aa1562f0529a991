"""Retry, catch, timeout, environment, current, branches with merge_artifacts, nested foreach, arrays."""

import os
import time

import numpy as np

from stoker import (
    Config,
    FlowSpec,
    IncludeFile,
    JSONType,
    Parameter,
    catch,
    current,
    environment,
    retry,
    step,
    timeout,
)


class FeaturesFlow(FlowSpec):
    grid = Parameter("grid", default='{"a": [1, 2], "b": [10, 20, 30]}', type=JSONType)
    notes = IncludeFile("notes", default=None)
    cfg = Config("cfg", default_value={"train": {"lr": 0.1, "steps": 3}})
    sleep = Parameter("sleep", default=0.0, type=float)

    @environment(vars={"STOKER_TEST_VAR": "set-by-decorator"})
    @step
    def start(self):
        self.env_value = os.environ.get("STOKER_TEST_VAR")
        self.info = {"flow": current.flow_name, "run": current.run_id, "step": current.step_name,
                     "task": current.task_id, "running": current.is_running_flow, "user": current.username}
        self.arr = np.arange(1000, dtype=np.float32).reshape(10, 100)
        self.lr = self.cfg.train.lr
        self.next(self.flaky, self.safe)

    @retry(times=2, minutes_between_retries=0)
    @step
    def flaky(self):
        self.attempt_seen = current.retry_count
        if current.retry_count < 2:
            raise ValueError(f"flaky fails on attempt {current.retry_count}")
        self.shared = "same"
        self.branch = "flaky"
        self.next(self.join_branches)

    @catch(var="err")
    @timeout(seconds=1)
    @step
    def safe(self):
        self.shared = "same"
        self.branch = "safe"
        time.sleep(30)  # the timeout fires; @catch keeps the flow going
        self.next(self.join_branches)

    @step
    def join_branches(self, inputs):
        self.caught = str(inputs.safe.err)
        self.attempt_seen = inputs.flaky.attempt_seen
        self.branches = sorted(i.branch for i in inputs)
        self.merge_artifacts(inputs, exclude=["branch", "err", "attempt_seen"])
        self.next(self.outer)

    @step
    def outer(self):
        self.letters = list(self.grid)
        self.next(self.per_letter, foreach="letters")

    @step
    def per_letter(self):
        self.letter = self.input
        self.values = self.grid[self.letter]
        self.next(self.per_value, foreach="values")

    @step
    def per_value(self):
        time.sleep(self.sleep)
        self.pair = (self.letter, self.input, [i for i, _, _ in self.foreach_stack()])
        self.next(self.join_values)

    @step
    def join_values(self, inputs):
        self.pairs = [i.pair for i in inputs]
        self.merge_artifacts(inputs, exclude=["pair"])
        self.next(self.join_letters)

    @step
    def join_letters(self, inputs):
        self.all_pairs = sorted(p for i in inputs for p in i.pairs)
        self.merge_artifacts(inputs, include=["arr", "shared", "info", "env_value", "lr", "caught",
                                              "attempt_seen", "branches"])
        self.next(self.end)

    @step
    def end(self):
        assert self.arr.sum() == 499500
        self.notes_len = len(self.notes or "")


if __name__ == "__main__":
    FeaturesFlow()
