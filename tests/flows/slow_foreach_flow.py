"""Tasks record when they run, to check concurrency limits; `cpu` asks @resources(cpu=...)."""

import time

from stoker import FlowSpec, Parameter, resources, step


class SlowForeachFlow(FlowSpec):
    n = Parameter("n", default=6, type=int)
    seconds = Parameter("seconds", default=0.4, type=float)

    @step
    def start(self):
        self.items = list(range(self.n))
        self.next(self.work, foreach="items")

    @resources(cpu=2)
    @step
    def work(self):
        self.t0 = time.time()
        time.sleep(self.seconds)
        self.t1 = time.time()
        self.next(self.join)

    @step
    def join(self, inputs):
        self.spans = [(i.t0, i.t1) for i in inputs]
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    SlowForeachFlow()
