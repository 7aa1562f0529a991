"""Invalid: a step that is both a join (it takes inputs) and a split (it starts new branches)."""

from metaflow import FlowSpec, step


class JoinSplitFlow(FlowSpec):
    """`both` joins a and b and splits again at once: Metaflow's linter refuses it."""

    @step
    def start(self):
        self.next(self.a, self.b)

    @step
    def a(self):
        self.next(self.both)

    @step
    def b(self):
        self.next(self.both)

    @step
    def both(self, inputs):
        self.next(self.c, self.d)

    @step
    def c(self):
        self.next(self.join)

    @step
    def d(self):
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    JoinSplitFlow()
