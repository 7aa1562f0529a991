"""Invalid: a switch that goes back to an earlier step (only a step's switch to itself may loop)."""

from metaflow import FlowSpec, step


class SwitchBackFlow(FlowSpec):
    """`check` goes back to `work`: a loop through two steps, which Metaflow's linter refuses."""

    @step
    def start(self):
        self.n = 0
        self.next(self.work)

    @step
    def work(self):
        self.n += 1
        self.next(self.check)

    @step
    def check(self):
        self.again = self.n < 2
        self.next({True: self.work, False: self.end}, condition="again")

    @step
    def end(self):
        pass


if __name__ == "__main__":
    SwitchBackFlow()
