"""A step that sleeps, to interrupt a run."""

import time

from stoker import FlowSpec, step


class SleepyFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.nap)

    @step
    def nap(self):
        print("napping", flush=True)
        time.sleep(120)
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    SleepyFlow()
