# From Metaflow's documentation, https://docs.metaflow.org/production/scheduling-metaflow-flows/scheduling-with-argo-workflows
# (github.com/Netflix/metaflow-docs docs/production/scheduling-metaflow-flows/scheduling-with-argo-workflows.md at 1d023210; Apache License 2.0). Verbatim below this header.
# ruff: noqa
from metaflow import FlowSpec, schedule, step
from datetime import datetime

@schedule(hourly=True)
class HourlyFlow(FlowSpec):

    @step
    def start(self):
        now = datetime.now().strftime('%Y-%m-%d %H:%M:%S')
        print('time is %s' % now)
        self.next(self.end)

    @step
    def end(self):
        pass

if __name__ == '__main__':
    HourlyFlow()
