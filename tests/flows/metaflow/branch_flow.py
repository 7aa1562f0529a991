"""Static branches: `self.next(self.a, self.b)`, `inputs.<step>` and merge_artifacts (exclude= and include=)."""

from metaflow import FlowSpec, step


class BranchFlow(FlowSpec):
    """Two splits, each joined: the first by name, the second by iterating."""

    @step
    def start(self):
        self.common = "shared"
        self.x = 0
        self.next(self.a, self.b)

    @step
    def a(self):
        self.x = 1
        self.only_a = "A"
        self.next(self.join)

    @step
    def b(self):
        self.x = 2
        self.next(self.join)

    @step
    def join(self, inputs):
        self.xs = [inputs.a.x, inputs.b.x]
        self.merge_artifacts(inputs, exclude=["x"])
        assert self.common == "shared" and self.only_a == "A"
        self.next(self.fan_out)

    @step
    def fan_out(self):  # Metaflow does not allow a join to be a split too
        self.next(self.c, self.d)

    @step
    def c(self):
        self.score = 10
        self.label = "same"
        self.next(self.join2)

    @step
    def d(self):
        self.score = 20
        self.label = "same"
        self.next(self.join2)

    @step
    def join2(self, inputs):
        self.best = max(inp.score for inp in inputs)
        self.merge_artifacts(inputs, include=["label", "common", "xs"])
        self.next(self.end)

    @step
    def end(self):
        self.summary = f"{self.common}:{self.xs}:{self.best}:{self.label}"


if __name__ == "__main__":
    BranchFlow()
