"""A foreach over --n items (500 in the scale test) and a join that counts its inputs."""

from stoker import FlowSpec, Parameter, step


class WideForeachFlow(FlowSpec):
    n = Parameter("n", default=500, type=int, help="number of foreach items")

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
        self.count = len(inputs)
        self.total = sum(i.sq for i in inputs)
        self.next(self.end)

    @step
    def end(self):
        assert self.count == self.n, (self.count, self.n)
        assert self.total == sum(i * i for i in range(self.n)), self.total
        print("wide foreach ok:", self.count)


if __name__ == "__main__":
    WideForeachFlow()
