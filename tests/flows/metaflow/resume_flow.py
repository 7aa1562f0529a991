"""A run that fails in its middle step until a file exists, then is resumed (`python flow.py resume`)."""

import os

from metaflow import FlowSpec, current, step


class ResumeFlow(FlowSpec):
    """start succeeds; middle fails while fixed.txt is missing; a resume clones start and reruns the rest."""

    @step
    def start(self):
        self.started_in = current.run_id
        self.next(self.middle)

    @step
    def middle(self):
        if not os.path.exists("fixed.txt"):
            raise RuntimeError("fixed.txt is missing")
        self.middle_run = current.run_id
        self.next(self.end)

    @step
    def end(self):
        self.origin = current.origin_run_id


if __name__ == "__main__":
    ResumeFlow()
