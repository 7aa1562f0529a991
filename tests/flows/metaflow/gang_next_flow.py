"""A gang whose worker nodes return before self.next() (only the control node calls it), read by control_tasks."""

from metaflow import FlowSpec, current, parallel, step


class GangNextFlow(FlowSpec):
    """Worker nodes (node_index > 0) return early; Metaflow's client lists the control task."""

    @step
    def start(self):
        self.next(self.gang, num_parallel=3)

    @parallel
    @step
    def gang(self):
        self.node = current.parallel.node_index
        if current.parallel.node_index != 0:
            return
        self.next(self.join)

    @step
    def join(self, inputs):
        self.nodes = sorted(i.node for i in inputs)
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    GangNextFlow()
