"""Benchmark flow for benchmarks/slurm.py: a foreach over N trivial tasks (default 20) and its join.

    python benchmarks/flows/slurm_foreach_flow.py run --n 20                    # local backend
    python benchmarks/flows/slurm_foreach_flow.py run --n 20 --backend slurm    # every step on Slurm
"""

from stoker import FlowSpec, Parameter, step


class SlurmForeachFlow(FlowSpec):
    """Square every item in its own task (no real work: the benchmark measures per-task overhead)."""

    n = Parameter("n", default=20, type=int, help="number of foreach items")

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
        assert self.count == self.n, (self.count, self.n)
        assert self.total == sum(i * i for i in range(self.n)), self.total
        print("foreach ok:", self.count, self.total)


if __name__ == "__main__":
    SlurmForeachFlow()
