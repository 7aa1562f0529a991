"""Conditional transitions: a switch at the top, one in a static branch, one in a foreach, and a recursive one."""

import os

from metaflow import FlowSpec, Parameter, current, step


class SwitchFlow(FlowSpec):
    """start switches on `mode`; the chosen branch converges on `fan` (no inputs); more switches follow."""

    mode = Parameter("mode", default="fast")
    rounds = Parameter("rounds", default=3, type=int)

    @step
    def start(self):
        self.items = [1, 2, 3]
        self.mode_seen = self.mode
        self.next({"fast": self.fast, "slow": self.slow}, condition="mode_seen")

    @step
    def fast(self):
        self.path = "fast"
        self.next(self.fan)

    @step
    def slow(self):
        self.path = "slow"
        self.next(self.fan)

    @step
    def fan(self):
        self.next(self.left, self.right)

    @step
    def left(self):
        self.side = "even" if len(self.path) % 2 == 0 else "odd"
        self.next({"even": self.left_even, "odd": self.left_odd}, condition="side")

    @step
    def left_even(self):
        self.label = "left-even"
        self.next(self.left_done)

    @step
    def left_odd(self):
        self.label = "left-odd"
        self.next(self.left_done)

    @step
    def left_done(self):
        self.next(self.join_sides)

    @step
    def right(self):
        self.label = "right"
        self.next(self.join_sides)

    @step
    def join_sides(self, inputs):
        self.labels = sorted(i.label for i in inputs)
        self.merge_artifacts(inputs, exclude=["label", "side"])
        self.next(self.spread)

    @step
    def spread(self):
        self.next(self.each, foreach="items")

    @step
    def each(self):
        self.size = "big" if self.input > 1 else "small"
        self.next({"big": self.big, "small": self.small}, condition="size")

    @step
    def big(self):
        self.out = self.input * 10
        self.next(self.join_each)

    @step
    def small(self):
        self.out = self.input
        self.next(self.join_each)

    @step
    def join_each(self, inputs):
        self.outs = sorted(i.out for i in inputs)
        self.merge_artifacts(inputs, include=["path", "labels"])
        self.count = 0
        self.next(self.loop)

    @step
    def loop(self):
        self.count += 1
        self.again = "yes" if self.count < self.rounds else "no"
        self.next({"yes": self.loop, "no": self.end}, condition="again")

    @step
    def end(self):
        if os.environ.get("SWITCH_FAIL_END") and not os.path.exists("fixed.txt"):
            raise RuntimeError("fixed.txt is missing")
        self.summary = f"{self.path}:{self.labels}:{self.outs}:{self.count}"
        self.run_of_end = current.run_id


if __name__ == "__main__":
    SwitchFlow()
