"""A gang of two nodes under @retry that sleeps, to be cancelled from outside (scancel): a person's cancel ends the
run, it is not retried."""

import time

from stoker import FlowSpec, current, parallel, retry, step


class SleepyGangFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.nap, num_parallel=2)

    @retry(times=2, minutes_between_retries=0)
    @parallel
    @step
    def nap(self):
        print(f"napping on node {current.parallel.node_index}", flush=True)
        time.sleep(120)
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    SleepyGangFlow()
