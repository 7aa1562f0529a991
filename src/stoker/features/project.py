"""`@project(name=...)`: flows of one project share namespaces, as with Metaflow's @project.

The naming rules (branches, system tags) are in stoker.flow.project; here, what a task of a project flow sees:
`current.project_name`, `current.branch_name`, `current.project_flow_name`, `current.is_production`,
`current.is_user_branch`, and `current.tags` without the run's project system tags.
"""

from __future__ import annotations

from stoker.flow.current import current
from stoker.flow.decorators import FlowDecorator, TaskContext
from stoker.flow.project import BRANCH_TAG, PROJECT_TAG, project_from_tags


class ProjectDecorator(FlowDecorator):
    """Put the flow in project `name` (lowercase letters, digits and `_`). `branch` and `production` may be
    given here or on the command line (`--branch`, `--production`), not both."""

    name = "project"
    defaults = {"name": None, "branch": None, "production": False}
    order = 0  # the run's identity first

    def task_started(self, ctx: TaskContext) -> None:
        spec = ctx.spec
        info = project_from_tags(list(spec.tags), spec.flow)
        current._set(tags=user_tags(spec.tags), **(info.as_current() if info else {}))


def user_tags(tags: list[str]) -> set[str]:
    """`current.tags`, as Metaflow's: the run's user tags (`--tag`), not its system tags (@project's, which
    come first in a spec); a user's own `project:x` tag stays."""
    rest = list(tags)
    for prefix in (PROJECT_TAG, BRANCH_TAG):
        first = next((t for t in rest if t.startswith(prefix)), None)
        if first is not None:
            rest.remove(first)
    return set(rest)


project = ProjectDecorator.make()
