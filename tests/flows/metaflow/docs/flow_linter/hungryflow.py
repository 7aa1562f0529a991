# From Metaflow's documentation, https://docs.metaflow.org/metaflow/composing-flows/mutators
# (github.com/Netflix/metaflow-docs docs/metaflow/composing-flows/mutators.md at 1d023210; Apache License 2.0). Verbatim below this header.
# ruff: noqa
from metaflow import FlowSpec, step, resources, Config

from flow_linter import flow_linter

@flow_linter
class HungryFlow(FlowSpec):

    limits = Config('limits', default='limits.json')

    @resources(cpu=16)
    @step
    def start(self):
        print(self._graph_info)
        self.next(self.end)

    @step
    def end(self):
        pass

if __name__ == '__main__':
    HungryFlow()
