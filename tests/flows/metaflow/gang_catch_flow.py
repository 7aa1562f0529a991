"""@catch on a gang step one of whose nodes is killed on every attempt: the flow goes on."""

import os
import signal

from metaflow import FlowSpec, catch, current, parallel, step


class GangCatchFlow(FlowSpec):
    """Node 1 of the gang is SIGKILLed; @catch records the failure and the join reads it."""

    @step
    def start(self):
        self.next(self.gang, num_parallel=2)

    @catch(var="failure")
    @parallel
    @step
    def gang(self):
        if current.parallel.node_index == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        self.next(self.join)

    @step
    def join(self, inputs):
        self.inputs_seen = len(list(inputs))
        self.all_caught = all(getattr(i, "failure", None) is not None for i in inputs)
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    GangCatchFlow()
