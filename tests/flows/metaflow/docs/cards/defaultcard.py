# From Metaflow's documentation, https://docs.metaflow.org/metaflow/visualizing-results/effortless-task-inspection-with-default-cards
# (github.com/Netflix/metaflow-docs docs/metaflow/visualizing-results/effortless-task-inspection-with-default-cards.md at 1d023210; Apache License 2.0). Verbatim below this header.
# ruff: noqa
from metaflow import FlowSpec, Parameter, step, card
from datetime import datetime

class DefaultCardFlow(FlowSpec):

    alpha = Parameter('alpha', default=0.5)

    @card
    @step
    def start(self):
        self.example_dict = {'first_key': list(range(10)),
                             'second_key': {'one', 'two'}}
        self.timestamp = datetime.utcnow()
        self.next(self.end)

    @step
    def end(self):
        pass

if __name__ == "__main__":
    DefaultCardFlow()
