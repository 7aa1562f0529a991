"""A 2-node gang whose node 1 works longer than node 0: the terminal shows each node's state as it changes."""

import time

from stoker import FlowSpec, current, parallel, step


class GangProgressFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.work, num_parallel=2)

    @parallel
    @step
    def work(self):
        time.sleep(0.5 if current.parallel.node_index == 0 else 4.0)
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    GangProgressFlow()
