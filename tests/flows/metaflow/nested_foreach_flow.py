"""A foreach inside a foreach, with foreach_stack() and a join per level."""

from metaflow import FlowSpec, step


class GridFlow(FlowSpec):
    """A grid of models x learning rates."""

    @step
    def start(self):
        self.models = ["small", "large"]
        self.next(self.per_model, foreach="models")

    @step
    def per_model(self):
        self.model = self.input
        self.lrs = [0.1, 0.01, 0.001]
        self.next(self.train, foreach="lrs")

    @step
    def train(self):
        self.lr = self.input
        self.stack = [(i, n, v) for i, n, v in self.foreach_stack()]
        self.score = f"{self.model}@{self.lr}"
        self.next(self.inner_join)

    @step
    def inner_join(self, inputs):
        self.scores = [inp.score for inp in inputs]
        self.merge_artifacts(inputs, include=["model"])
        self.next(self.outer_join)

    @step
    def outer_join(self, inputs):
        self.grid = {inp.model: inp.scores for inp in inputs}
        self.next(self.end)

    @step
    def end(self):
        self.count = sum(len(v) for v in self.grid.values())


if __name__ == "__main__":
    GridFlow()
