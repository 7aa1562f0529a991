"""The naming rules of `@project(name=...)` (stoker.features.project): flows of one project share namespaces, as
with Metaflow's @project.

Every run of a project flow carries the system tags `project:<name>` and `project_branch:<branch>`, so the
client sees a project's runs with `namespace("project:<name>")` and one branch's with
`namespace("project_branch:<branch>")`. The branch is `user.<username>` by default, `test.<branch>` with
`--branch BRANCH`, `prod` with `--production` and `prod.<branch>` with both (top-level options:
`python flow.py --branch x run`). A task reads them as `current.project_name`, `current.branch_name`,
`current.project_flow_name` (`<project>.<branch>.<flow>`), `current.is_production` and
`current.is_user_branch`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from stoker.errors import ConfigError
from stoker.flow.decorators import get_flow_decorator

# as Metaflow: other systems that see these names may rely on these limits
VALID_NAME_RE = "[^a-z0-9_]"
VALID_NAME_LEN = 128
PROJECT_TAG, BRANCH_TAG = "project:", "project_branch:"


@dataclass(frozen=True)
class ProjectInfo:
    """The project, branch and flow name of a run."""

    project_name: str
    branch_name: str
    project_flow_name: str
    is_production: bool
    is_user_branch: bool

    @property
    def tags(self) -> list[str]:
        """The run's system tags (Metaflow's sticky sys tags)."""
        return [PROJECT_TAG + self.project_name, BRANCH_TAG + self.branch_name]

    def as_current(self) -> dict[str, Any]:
        return {"project_name": self.project_name, "branch_name": self.branch_name,
                "project_flow_name": self.project_flow_name, "is_production": self.is_production,
                "is_user_branch": self.is_user_branch}


def format_name(flow_name: str, project_name: Any, deploy_prod: bool, given_branch: str | None,
                user_name: str) -> tuple[str, str]:
    """(project flow name, branch) exactly as Metaflow forms them; bad names are errors."""
    if not project_name:
        raise ConfigError("@project needs a name. Try @project(name='some_name')")
    if not isinstance(project_name, str) or re.search(VALID_NAME_RE, project_name):
        raise ConfigError(f"@project(name={project_name!r}): the @project name must contain only lowercase "
                          f"alphanumeric characters and underscores")
    if len(project_name) > VALID_NAME_LEN:
        raise ConfigError(f"the @project name must be shorter than {VALID_NAME_LEN} characters")
    if given_branch:
        if re.search(VALID_NAME_RE, str(given_branch)):
            raise ConfigError(f"branch {given_branch!r}: the branch name must contain only lowercase alphanumeric "
                              f"characters and underscores")
        if len(given_branch) > VALID_NAME_LEN:
            raise ConfigError(f"branch name is too long. The maximum is {VALID_NAME_LEN} characters")
        branch = f"{'prod' if deploy_prod else 'test'}.{given_branch}"
    elif deploy_prod:
        branch = "prod"
    else:
        branch = "user." + os.environ.get("METAFLOW_OWNER", user_name)
    return ".".join((project_name, branch, flow_name)), branch


def project_info(flow_cls: type, user: str, branch: str | None = None, production: bool = False,
                 flow_name: str | None = None) -> ProjectInfo | None:
    """The run's project and branch from `@project` (config values already bound) and the `--branch` /
    `--production` options; None for a flow without @project."""
    deco = get_flow_decorator(flow_cls, "project")
    if deco is None:
        return None
    options = {"branch": branch, "production": bool(production)}
    for op, value in options.items():
        if op in deco.user_defined and value != deco.defaults[op] and deco.attributes[op] != value:
            raise ConfigError(f"you cannot pass {op} as both a command-line argument (--{op}) and an attribute "
                              f"of the @project decorator: drop one of them")
    use_branch = deco.attributes["branch"] if "branch" in deco.user_defined else branch
    use_prod = bool(deco.attributes["production"]) if "production" in deco.user_defined else bool(production)
    flow_name = flow_name or flow_cls.__name__
    full, branch_name = format_name(flow_name, deco.attributes["name"], use_prod, use_branch, user)
    return ProjectInfo(project_name=deco.attributes["name"], branch_name=branch_name, project_flow_name=full,
                       is_production=use_prod, is_user_branch=use_branch is None and not use_prod)


def project_from_tags(tags: list[str] | tuple[str, ...], flow_name: str) -> ProjectInfo | None:
    """What a task knows of its run's project, from the run's tags (a task needs nothing else)."""
    name = next((t[len(PROJECT_TAG):] for t in tags if t.startswith(PROJECT_TAG)), None)
    branch = next((t[len(BRANCH_TAG):] for t in tags if t.startswith(BRANCH_TAG)), None)
    if name is None or branch is None:
        return None
    return ProjectInfo(project_name=name, branch_name=branch, project_flow_name=f"{name}.{branch}.{flow_name}",
                       is_production=branch == "prod" or branch.startswith("prod."),
                       is_user_branch=branch.startswith("user."))
