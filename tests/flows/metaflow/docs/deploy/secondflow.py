# From Metaflow's documentation, https://docs.metaflow.org/production/event-triggering/flow-events
# (github.com/Netflix/metaflow-docs docs/production/event-triggering/flow-events.md at 1d023210; Apache License 2.0). Verbatim below this header.
# ruff: noqa
from metaflow import FlowSpec, step, trigger_on_finish

@trigger_on_finish(flow='FirstFlow')
class SecondFlow(FlowSpec):

    @step
    def start(self):
        print("This is the second flow")
        self.next(self.end)

    @step
    def end(self):
        pass

if __name__ == '__main__':
    SecondFlow()
