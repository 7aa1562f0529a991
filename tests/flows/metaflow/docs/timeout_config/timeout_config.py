# From Metaflow's documentation, https://docs.metaflow.org/metaflow/configuring-flows/basic-configuration
# (github.com/Netflix/metaflow-docs docs/metaflow/configuring-flows/basic-configuration.md at 1d023210; Apache License 2.0). Verbatim below this header.
# ruff: noqa
import time
from metaflow import FlowSpec, step, Config, timeout

class TimeoutConfigFlow(FlowSpec):
    config = Config("config", default="myconfig.json")

    @timeout(seconds=config.timeout)
    @step
    def start(self):
        print(f"timing out after {self.config.timeout} seconds")
        time.sleep(7)
        print("success")
        self.next(self.end)

    @step
    def end(self):
        print("full config", self.config)

if __name__ == "__main__":
    TimeoutConfigFlow()
