"""A gang of 2 nodes with @monitor: each node samples itself into its own series."""

import time

from stoker import FlowSpec, current, monitor, parallel, step


class MonitorGangFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.work, num_parallel=2)

    @monitor(interval=0.2)
    @parallel
    @step
    def work(self):
        self.node = current.parallel.node_index
        time.sleep(1.0)
        self.next(self.join)

    @step
    def join(self, inputs):
        self.nodes = sorted(i.node for i in inputs)
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    MonitorGangFlow()
