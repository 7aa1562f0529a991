"""Parameters of every kind and `current`, as a Metaflow user writes them."""

import os

from metaflow import FlowSpec, IncludeFile, JSONType, Parameter, current, step


class ParamsFlow(FlowSpec):
    """Reads typed parameters, an included file and the task's `current` attributes."""

    alpha = Parameter("alpha", help="learning rate", default=0.01)
    steps = Parameter("steps", help="number of steps", default=3, type=int)
    greeting = Parameter("greeting", default="hello")
    flag = Parameter("flag", default=False, type=bool)
    hparams = Parameter("hparams", type=JSONType, default='{"layers": 2, "act": "relu"}')
    notes = IncludeFile("notes", is_text=True, help="a text file with notes")

    @step
    def start(self):
        self.info = {
            "flow_name": current.flow_name,
            "run_id": current.run_id,
            "step_name": current.step_name,
            "task_id": current.task_id,
            "pathspec": current.pathspec,
            "retry_count": current.retry_count,
            "origin_run_id": current.origin_run_id,
            "is_running_flow": current.is_running_flow,
            "username": current.username,
            "namespace": current.namespace,
            "tempdir_exists": os.path.isdir(current.tempdir),
        }
        self.types = [type(v).__name__ for v in (self.alpha, self.steps, self.greeting, self.flag, self.hparams)]
        self.product = self.alpha * self.steps
        self.next(self.end)

    @step
    def end(self):
        self.end_step = current.step_name
        self.message = f"{self.greeting} x{self.hparams['layers']}"
        self.notes_lines = self.notes.splitlines() if self.notes else []


if __name__ == "__main__":
    ParamsFlow()
