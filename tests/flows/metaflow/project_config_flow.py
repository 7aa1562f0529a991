"""@project named by a Config, and Config values in step decorators (config_expr, cfg.x, **cfg.x)."""

import os  # noqa: I001 (the metaflow import stays on one line, see tests/compat/engines.py)

from metaflow import Config, FlowSpec, config_expr, current, environment, project, resources, retry, secrets, step  # noqa: E501


def shout(text):
    return text.upper() + "!"


@project(name=config_expr("cfg.project"))
class ProjectConfigFlow(FlowSpec):
    """Its project, its retries, resources and environment come from one Config."""

    cfg = Config("cfg", default_value={"project": "compat_proj", "cpu": 1, "retries": 1, "greeting": "hello",
                                       "env": {"vars": {"MODE": "fast"}}})

    @retry(times=cfg.retries, minutes_between_retries=0)
    @resources(cpu=config_expr("cfg.cpu"))
    @environment(vars={"GREETING": config_expr("shout(cfg.greeting)")})
    @step
    def start(self):
        if current.retry_count < 1:
            raise RuntimeError("fails once: @retry(times=cfg.retries) runs it again")
        self.attempts = current.retry_count + 1
        self.greeting = os.environ.get("GREETING")
        self.project = {"project_name": current.project_name, "branch_name": current.branch_name,
                        "project_flow_name": current.project_flow_name, "is_production": current.is_production,
                        "is_user_branch": current.is_user_branch}
        self.next(self.end)

    @environment(**cfg.env)
    @secrets(sources=[{"type": "inline", "id": "tok", "options": {"env_vars": {"COMPAT_TOKEN": "tok-6f1e-secret"}}}])
    @step
    def end(self):
        self.mode = os.environ.get("MODE")
        self.token_ok = os.environ.get("COMPAT_TOKEN") == "tok-6f1e-secret"
        print("the token is", os.environ.get("COMPAT_TOKEN"))


if __name__ == "__main__":
    ProjectConfigFlow()
