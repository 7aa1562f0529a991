"""A step with @timeout(seconds=2) that needs about 1 s once it runs (however long it waited in a queue)."""

import time

from stoker import FlowSpec, step, timeout


class TimeoutFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.nap)

    @timeout(seconds=2)
    @step
    def nap(self):
        time.sleep(1)
        self.slept = True
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    TimeoutFlow()
