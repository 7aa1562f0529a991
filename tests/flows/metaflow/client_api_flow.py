"""The client's view of a run: task lineage, logs, metadata, tags, and a caught exception."""

import os
import sys
import time

from metaflow import FlowSpec, catch, step


class ClientApiFlow(FlowSpec):
    """start fans out over two items, then splits into two branches, one raises under @catch,
    the other fails while $CLIENT_API_FAIL is set (to be resumed)."""

    @step
    def start(self):
        print("hello from start")
        print("warning from start", file=sys.stderr)
        self.items = [1, 2]
        self.next(self.fan, foreach="items")

    @step
    def fan(self):
        self.x = self.input * 10
        print(f"fan {self.x}")
        self.next(self.gather)

    @step
    def gather(self, inputs):
        self.xs = sorted(i.x for i in inputs)
        self.next(self.split)

    @step
    def split(self):
        self.next(self.left, self.right)

    @catch(var="failure")
    @step
    def left(self):
        open("left.raised", "w").close()  # lets `right` fail only once this task's @catch is under way
        raise ValueError("left went wrong")
        self.next(self.both)

    @step
    def right(self):
        if os.environ.get("CLIENT_API_FAIL"):
            # A failed task stops the run's other tasks (on both engines): wait until `left` has raised and
            # its @catch has had time to store the exception, or a loaded machine makes this test racy.
            deadline = time.time() + 120
            while not os.path.exists("left.raised") and time.time() < deadline:
                time.sleep(0.1)
            time.sleep(5)
            raise ValueError("right failed on purpose")
        self.side = "right"
        self.next(self.both)

    @step
    def both(self, inputs):
        self.caught = inputs.left.failure is not None
        self.xs = inputs.right.xs
        self.next(self.end)

    @step
    def end(self):
        print("the end")


if __name__ == "__main__":
    ClientApiFlow()
