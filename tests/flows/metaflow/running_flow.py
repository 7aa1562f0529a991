"""A run that waits in its middle step until go.txt exists, so that a client can look at it while it runs."""

import os
import time

from metaflow import FlowSpec, step


class RunningFlow(FlowSpec):
    """start, then wait (until go.txt appears, at most 120 s), then end."""

    @step
    def start(self):
        self.next(self.wait)

    @step
    def wait(self):
        deadline = time.time() + 120
        while not os.path.exists("go.txt") and time.time() < deadline:
            time.sleep(0.2)
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    RunningFlow()
