"""The Runner API's flow: parameters of several types, a line on stdout and stderr, a step that fails on demand,
and a process that exits before its run starts ($RUNNER_BROKEN)."""

import os
import sys

from metaflow import FlowSpec, JSONType, Parameter, step


class RunnerFlow(FlowSpec):
    """start -> middle -> end; `middle` fails while the file named by $RUNNER_FAIL_FILE exists."""

    alpha = Parameter("alpha", default=1, type=int)
    label = Parameter("label", default="x")
    loud = Parameter("loud", default=False, type=bool)
    extra = Parameter("extra", default='{"k": 0}', type=JSONType)

    @step
    def start(self):
        self.doubled = self.alpha * 2
        print(f"alpha is {self.alpha}")
        print("a line on stderr", file=sys.stderr)
        self.next(self.middle)

    @step
    def middle(self):
        marker = os.environ.get("RUNNER_FAIL_FILE")
        if marker and os.path.exists(marker):
            raise RuntimeError("failing on demand")
        self.seen = [self.label, self.loud, self.extra]
        self.next(self.end)

    @step
    def end(self):
        print(f"done {self.doubled}")


if __name__ == "__main__":
    if os.environ.get("RUNNER_BROKEN"):
        sys.exit("this flow is broken on demand")
    RunnerFlow()
