# From Metaflow's documentation, https://docs.metaflow.org/metaflow/managing-flows/runner
# (github.com/Netflix/metaflow-docs docs/metaflow/managing-flows/runner.md at 1d023210; Apache License 2.0). Verbatim below this header.
# ruff: noqa
import time
from metaflow import FlowSpec, Parameter, step

class SlowFlow(FlowSpec):

    secs = Parameter('seconds', default=3)

    @step
    def start(self):
        for i in range(self.secs):
            print(f"{i} seconds passed")
            time.sleep(1)
        self.next(self.end)

    @step
    def end(self):
        pass
    
if __name__ == '__main__':
    SlowFlow()
