# From Metaflow's documentation, https://docs.metaflow.org/metaflow/configuring-flows/custom-parsers
# (github.com/Netflix/metaflow-docs docs/metaflow/configuring-flows/custom-parsers.md at 1d023210; Apache License 2.0). Verbatim below this header.
# ruff: noqa
from metaflow import step, Config
from tracked_flow import TrackedFlowSpec

class MyTrackedFlow(TrackedFlowSpec):
    config = Config("config", default="myconfig.json")

    @step
    def start(self):
        self.output_git_info()
        self.next(self.end)

    @step
    def end(self):
        print("config", self.config)

if __name__ == "__main__":
    MyTrackedFlow()
