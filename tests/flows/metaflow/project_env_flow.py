"""@project's branch from METAFLOW_BRANCH, set by the flow file before its class (as click's auto_envvar_prefix)."""

import os

from metaflow import FlowSpec, current, project, step

os.environ["METAFLOW_BRANCH"] = "from_file"


@project(name="envproj")
class ProjectEnvFlow(FlowSpec):
    """The branch is test.from_file (prod.from_file with --production or METAFLOW_PRODUCTION=1)."""

    @step
    def start(self):
        self.branch = current.branch_name
        self.production = current.is_production
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    ProjectEnvFlow()
