# From Metaflow's documentation, https://docs.metaflow.org/production/coordinating-larger-metaflow-projects
# (github.com/Netflix/metaflow-docs docs/production/coordinating-larger-metaflow-projects.md at 1d023210; Apache License 2.0). Verbatim below this header.
# ruff: noqa
from metaflow import FlowSpec, step, project, current

@project(name='example_project')
class ProjectFlow(FlowSpec):

    @step
    def start(self):
        print('project name:', current.project_name)
        print('project branch:', current.branch_name)
        print('is this a production run?', current.is_production)
        self.next(self.end)

    @step
    def end(self):
        pass

if __name__ == '__main__':
    ProjectFlow()
