"""Fan out over a list with foreach, fan in with a join, and a static branch — artifacts flow through all of it.

    python examples/foreach.py run --n 5
"""

from stoker import FlowSpec, Parameter, step


class ForeachFlow(FlowSpec):
    """Square numbers in parallel tasks, then add them up."""

    n = Parameter("n", default=4, type=int, help="how many numbers")

    @step
    def start(self):
        self.numbers = list(range(1, self.n + 1))
        self.next(self.square, foreach="numbers")

    @step
    def square(self):
        self.value = self.input * self.input
        print(f"task {self.index}: {self.input}^2 = {self.value}")
        self.next(self.gather)

    @step
    def gather(self, inputs):
        self.squares = [i.value for i in inputs]
        self.merge_artifacts(inputs, exclude=["value"])
        self.next(self.branch)

    @step
    def branch(self):
        """A join does not split again (as in Metaflow): the static branches start here."""
        self.next(self.total, self.largest)

    @step
    def total(self):
        self.result = sum(self.squares)
        self.next(self.report)

    @step
    def largest(self):
        self.result = max(self.squares)
        self.next(self.report)

    @step
    def report(self, inputs):
        self.total_sum = inputs.total.result
        self.biggest = inputs.largest.result
        self.merge_artifacts(inputs, exclude=["result"])
        self.next(self.end)

    @step
    def end(self):
        print(f"sum of squares of 1..{self.n} = {self.total_sum}; largest {self.biggest}; numbers {self.numbers}")


if __name__ == "__main__":
    ForeachFlow()
