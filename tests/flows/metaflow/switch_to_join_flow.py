"""Invalid: a switch inside a static branch whose case goes straight to the join."""

from metaflow import FlowSpec, step


class SwitchToJoinFlow(FlowSpec):
    """`pick` may go straight to `join`: Metaflow refuses a conditional path that leads directly to a join."""

    @step
    def start(self):
        self.choice = "x"
        self.next(self.pick, self.other)

    @step
    def pick(self):
        self.next({"x": self.x, "y": self.join}, condition="choice")

    @step
    def x(self):
        self.next(self.join)

    @step
    def other(self):
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    SwitchToJoinFlow()
