"""Benchmark flow: six steps in a line, each passing a small artifact to the next (written for Metaflow)."""

from metaflow import FlowSpec, step


class LinearFlow(FlowSpec):
    """start -> a -> b -> c -> d -> end; the end step checks the counter every step incremented."""

    @step
    def start(self):
        self.count = 1
        self.trail = ["start"]
        self.next(self.a)

    @step
    def a(self):
        self.count += 1
        self.trail = self.trail + ["a"]
        self.next(self.b)

    @step
    def b(self):
        self.count += 1
        self.trail = self.trail + ["b"]
        self.next(self.c)

    @step
    def c(self):
        self.count += 1
        self.trail = self.trail + ["c"]
        self.next(self.d)

    @step
    def d(self):
        self.count += 1
        self.trail = self.trail + ["d"]
        self.next(self.end)

    @step
    def end(self):
        self.count += 1
        assert self.count == 6, self.count
        assert self.trail == ["start", "a", "b", "c", "d"], self.trail
        print("linear ok:", self.count)


if __name__ == "__main__":
    LinearFlow()
