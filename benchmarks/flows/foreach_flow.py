"""Benchmark flow: a foreach over N items (default 100) and its join (written for Metaflow)."""

from metaflow import FlowSpec, Parameter, step


class ForeachFlow(FlowSpec):
    """Square every item in its own task, add the squares up in the join and check the sum."""

    n = Parameter("n", default=100, type=int, help="number of foreach items")

    @step
    def start(self):
        self.items = list(range(self.n))
        self.next(self.square, foreach="items")

    @step
    def square(self):
        self.sq = self.input * self.input
        self.next(self.join)

    @step
    def join(self, inputs):
        self.total = sum(i.sq for i in inputs)
        self.count = sum(1 for _ in inputs)
        self.next(self.end)

    @step
    def end(self):
        expected = sum(i * i for i in range(self.n))
        assert self.count == self.n, (self.count, self.n)
        assert self.total == expected, (self.total, expected)
        print("foreach ok:", self.count, self.total)


if __name__ == "__main__":
    ForeachFlow()
