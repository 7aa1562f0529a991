"""Fails in `middle` unless $RESUME_OK is set; `resume` must clone start and re-run middle and end."""

import os

from stoker import FlowSpec, Parameter, current, step


class ResumeFlow(FlowSpec):
    n = Parameter("n", default=3, type=int)

    @step
    def start(self):
        self.items = list(range(self.n))
        self.start_pid = os.getpid()
        self.next(self.work, foreach="items")

    @step
    def work(self):
        if self.input == 1 and not os.environ.get("RESUME_OK"):
            raise RuntimeError("work item 1 breaks until RESUME_OK is set")
        self.out = self.input * 10
        self.work_run = current.run_id
        self.next(self.join)

    @step
    def join(self, inputs):
        self.outs = [i.out for i in inputs]
        self.work_runs = [i.work_run for i in inputs]
        self.next(self.end)

    @step
    def end(self):
        self.origin = current.origin_run_id


if __name__ == "__main__":
    ResumeFlow()
