"""@project, Config values in decorators (config_expr), and @secrets (inline and AWS Secrets Manager on moto)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.compat.conftest import compare, outputs

pytestmark = pytest.mark.slow

FLOW = "project_config_flow.py"
PROJECT = """
    from metaflow import Flow, namespace
    namespace(None)
    run = Flow("ProjectConfigFlow").latest_run
    result = {"project": run["start"].task.data.project,
              "run_tags": sorted(t for t in run.system_tags if t.startswith("project")),
              "task_tags": sorted(t for t in run["start"].task.tags if t.startswith("project"))}
"""


def _ok(request, runs):
    compare(request, "exit status", {n: r.proc.returncode for n, r in runs.items()}, 0)


def _project(name: str, branch: str, production: bool, user_branch: bool) -> dict:
    return {"project": {"project_name": name, "branch_name": branch, "project_flow_name":
                        f"{name}.{branch}.ProjectConfigFlow", "is_production": production,
                        "is_user_branch": user_branch},
            "run_tags": [f"project:{name}", f"project_branch:{branch}"],
            "task_tags": [f"project:{name}", f"project_branch:{branch}"]}


def test_project_default_branch(both, request):
    """@project(name=config_expr(...)): the branch is user.<name>; runs and tasks carry project tags."""
    runs = both(FLOW)
    _ok(request, runs)
    got = {n: r.client(PROJECT) for n, r in runs.items()}
    compare(request, "current.project_* and the project tags", got,
            _project("compat_proj", "user.tester", False, True))


def test_project_branch_option(both, request):
    """`--branch feat1` (a top-level option) gives the branch test.feat1."""
    runs = both(FLOW, top=("--no-pylint", "--branch", "feat1"), key="branch")
    _ok(request, runs)
    got = {n: r.client(PROJECT) for n, r in runs.items()}
    compare(request, "branch test.feat1", got, _project("compat_proj", "test.feat1", False, False))


def test_project_production_option(both, request):
    """`--production` gives the branch prod; with `--branch rel` it is prod.rel."""
    runs = both(FLOW, top=("--no-pylint", "--production"), key="prod")
    _ok(request, runs)
    got = {n: r.client(PROJECT) for n, r in runs.items()}
    compare(request, "branch prod", got, _project("compat_proj", "prod", True, False))
    runs = both(FLOW, top=("--no-pylint", "--production", "--branch", "rel"), key="prodrel")
    _ok(request, runs)
    got = {n: r.client(PROJECT) for n, r in runs.items()}
    compare(request, "branch prod.rel", got, _project("compat_proj", "prod.rel", True, False))


def test_project_option_is_top_level(both, request):
    """`run --branch x` is refused: --branch and --production go before the command."""
    runs = both(FLOW, "--branch", "x")
    compare(request, "exit status", {n: r.proc.returncode for n, r in runs.items()}, 2)
    compare(request, "the error names --branch", {n: "--branch" in r.output for n, r in runs.items()}, True)


def test_project_namespaces(both, request):
    """namespace("project:...") and namespace("project_branch:...") show the project's runs."""
    runs = both(FLOW)
    got = {n: r.client("""
        from metaflow import Flow, namespace
        result = {}
        for ns in ("project:compat_proj", "project_branch:user.tester"):
            namespace(ns)
            result[ns] = [r.id for r in Flow("ProjectConfigFlow").runs()] == [Flow("ProjectConfigFlow").latest_run.id]
    """) for n, r in runs.items()}
    compare(request, "the run is seen in its project and branch namespaces", got,
            {"project:compat_proj": True, "project_branch:user.tester": True})


def test_config_values_in_decorators(both, request):
    """@retry(times=cfg.retries), config_expr("shout(cfg.greeting)") and @environment(**cfg.env) take the Config."""
    runs = both(FLOW)
    got = {n: r.client("""
        from metaflow import Flow, namespace
        namespace(None)
        run = Flow("ProjectConfigFlow").latest_run
        start = run["start"].task
        result = {"attempts": start.data.attempts, "greeting": start.data.greeting, "mode": run.data.mode}
    """) for n, r in runs.items()}
    compare(request, "retried once, environment from config expressions", got,
            {"attempts": 2, "greeting": "HELLO!", "mode": "fast"})


def test_secrets_inline(both, request):
    """@secrets with an inline source sets the step's environment; stoker never prints the value."""
    runs = both(FLOW)
    got = {n: r.client("""
        from metaflow import Flow, namespace
        namespace(None)
        result = Flow("ProjectConfigFlow").latest_run.data.token_ok
    """) for n, r in runs.items()}
    compare(request, "the secret is in the step's environment", got, True)
    assert "tok-6f1e-secret" not in runs["stoker"].output, outputs(runs)
    assert "the token is ***" in runs["stoker"].output, outputs(runs)


@pytest.fixture(scope="module")
def sm_env(moto_endpoint) -> dict[str, str]:
    """Two secrets in moto's Secrets Manager, and the environment that points both engines at it."""
    import boto3

    env = {"AWS_ENDPOINT_URL": moto_endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}
    client = boto3.client("secretsmanager", region_name="us-east-1", endpoint_url=moto_endpoint,
                          aws_access_key_id="test", aws_secret_access_key="test")
    for name, value in {"compat/db-creds": json.dumps({"DB_USER": "admin", "db-password": "pw-91b3-secret"}),
                        "compat-api-key": "key-55aa-plain"}.items():
        try:
            client.create_secret(Name=name, SecretString=value)
        except client.exceptions.ResourceExistsException:
            client.put_secret_value(SecretId=name, SecretString=value)
    return env


def test_secrets_aws_secrets_manager(both, request, sm_env):
    """AWS Secrets Manager secrets (JSON keys sanitized, a plain string by env_var_name) reach only their step."""
    runs = both("secrets_flow.py", env=sm_env)
    compare(request, "exit status", {n: r.proc.returncode for n, r in runs.items()}, 0)
    got = {n: r.client("""
        from metaflow import Flow
        run = Flow("SecretsFlow").latest_run
        result = {"lengths": run["start"].task.data.lengths, "user": run["start"].task.data.user,
                  "leaked": run.data.leaked}
    """) for n, r in runs.items()}
    compare(request, "variables, lengths and scope", got,
            {"lengths": {"DB_USER": 5, "db_password": 14, "API_KEY": 14, "INLINE_TOKEN": 12}, "user": "admin",
             "leaked": []})
    st = runs["stoker"]
    assert "db password: ***" in st.output and "pw-91b3-secret" not in st.output, outputs(runs)
    stored = [p for p in Path(st.home).rglob("*") if p.is_file() and any(
        s in p.read_bytes() for s in (b"pw-91b3-secret", b"key-55aa-plain", b"inl-7c2d-val"))]
    assert stored == [], f"secret values stored in {stored}"
