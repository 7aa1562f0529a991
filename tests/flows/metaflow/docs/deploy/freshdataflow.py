# From Metaflow's documentation, https://docs.metaflow.org/production/event-triggering/external-events
# (github.com/Netflix/metaflow-docs docs/production/event-triggering/external-events.md at 1d023210; Apache License 2.0). Verbatim below this header.
# ruff: noqa
from metaflow import FlowSpec, step, trigger

@trigger(event='data_updated')
class FreshDataFlow(FlowSpec):

    @step
    def start(self):
        # load data from the data warehouse
        print('processing fresh data!')
        self.next(self.end)

    @step
    def end(self):
        pass

if __name__ == '__main__':
    FreshDataFlow()
