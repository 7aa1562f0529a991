"""@project names and options, config expressions in decorators, and @secrets (sources, checks, redaction)."""

from __future__ import annotations

import io
import json
import os
import sys

import pytest

from stoker import Config, FlowSpec, config_expr, environment, project, resources, retry, secrets, step
from stoker.errors import ConfigError
from stoker.features.secrets import install_secrets, remove_secrets
from stoker.flow.configs import DelayEvaluator, bind_configs
from stoker.flow.decorators import get_decorator, get_flow_decorator
from stoker.flow.project import format_name, project_from_tags, project_info
from stoker.flow.secrets import SecretsError, SecretSpec, aws_secrets_manager_provider, get_secret
from stoker.redact import redact_text


def double(x):
    return 2 * x


def _flow(**cfg):
    @project(name=config_expr("cfg.project"))
    class F(FlowSpec):
        c = Config("cfg", default_value=cfg)

        @retry(times=c.retries, minutes_between_retries=0)
        @resources(cpu=config_expr("double(cfg.cpu)"))
        @environment(**c.env)
        @step
        def start(self):
            self.next(self.end)

        @step
        def end(self):
            pass

    return F


# --- config expressions -----------------------------------------------------------------------------------
def test_config_values_resolve_when_bound():
    flow = _flow(project="p1", retries=2, cpu=3, env={"vars": {"A": "b"}})
    deco = get_decorator(flow.start, "retry")
    assert deco.delayed and isinstance(deco.attributes["times"], DelayEvaluator)
    bind_configs(flow, {"c": flow.c.resolve()})
    assert get_decorator(flow.start, "retry").attributes["times"] == 2
    assert get_decorator(flow.start, "resources").attributes["cpu"] == 6.0  # a function of the flow's module
    assert get_decorator(flow.start, "environment").attributes["vars"] == {"A": "b"}  # **cfg.env
    assert get_flow_decorator(flow, "project").attributes["name"] == "p1"
    bind_configs(flow, {"c": {"project": "p2", "retries": 0, "cpu": 1, "env": {"vars": {}}}})  # rebinding
    assert get_decorator(flow.start, "retry").attributes["times"] == 0


def test_bad_config_value_is_checked_when_bound():
    flow = _flow(project="p", retries="many", cpu=1, env={})
    with pytest.raises(ConfigError, match=r"@retry\(times='many'\): must be a number"):
        bind_configs(flow, {"c": flow.c.resolve()})


def test_unknown_config_name_and_unbound_expression():
    e = config_expr("nope.x")
    with pytest.raises(ConfigError):
        e()
    flow = _flow(project="p", retries=1, cpu=1, env={})
    bind_configs(flow, {"c": flow.c.resolve()})
    with pytest.raises(ConfigError, match="could not be evaluated"):
        e()
    assert repr(flow.c.train.lr) == "config_expr('cfg.train.lr')"


def test_unknown_argument_from_unpacked_config():
    flow = _flow(project="p", retries=1, cpu=1, env={"vars": {}, "colour": "red"})
    with pytest.raises(ConfigError, match="@environment has no argument colour"):
        bind_configs(flow, {"c": flow.c.resolve()})


# --- @project --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("prod,branch,expected", [
    (False, None, "user.alice"), (False, "feat", "test.feat"), (True, None, "prod"), (True, "rel", "prod.rel")])
def test_branch_names(prod, branch, expected, monkeypatch):
    monkeypatch.delenv("METAFLOW_OWNER", raising=False)
    assert format_name("F", "proj", prod, branch, "alice") == (f"proj.{expected}.F", expected)


@pytest.mark.parametrize("name,branch,match", [
    ("", None, "needs a name"), ("Bad-Name", None, "lowercase"), ("x" * 129, None, "shorter"),
    ("ok", "Bad", "branch name")])
def test_bad_project_names(name, branch, match):
    with pytest.raises(ConfigError, match=match):
        format_name("F", name, False, branch, "alice")


def test_option_and_attribute_conflict():
    @project(name="p", branch="fixed")
    class F(FlowSpec):
        @step
        def start(self):
            self.next(self.end)

        @step
        def end(self):
            pass

    assert project_info(F, "u").branch_name == "test.fixed"
    assert project_info(F, "u", branch="fixed").branch_name == "test.fixed"  # the same value is not a conflict
    with pytest.raises(ConfigError, match="both a command-line argument"):
        project_info(F, "u", branch="other")
    info = project_from_tags(["user:u", "project:p", "project_branch:prod.x"], "F")
    assert info.is_production and info.project_flow_name == "p.prod.x.F" and not info.is_user_branch


# --- @secrets --------------------------------------------------------------------------------------------
def test_source_forms(monkeypatch):
    spec = SecretSpec.parse("aws-secrets-manager.a.b", role="r")
    assert (spec.secrets_backend_type, spec.secret_id, spec.role) == ("aws-secrets-manager", "a.b", "r")
    spec = SecretSpec.parse({"type": "inline", "id": "x", "role": "own"}, role="r")
    assert spec.role == "own"
    monkeypatch.delenv("METAFLOW_DEFAULT_SECRETS_BACKEND_TYPE", raising=False)
    monkeypatch.delenv("STOKER_DEFAULT_SECRETS_BACKEND_TYPE", raising=False)
    with pytest.raises(ConfigError, match="METAFLOW_DEFAULT_SECRETS_BACKEND_TYPE"):
        SecretSpec.parse("plain-id", role=None)
    monkeypatch.setenv("METAFLOW_DEFAULT_SECRETS_BACKEND_TYPE", "inline")
    assert SecretSpec.parse("plain-id", role=None).secrets_backend_type == "inline"
    with pytest.raises(ConfigError, match="'id' must be a string"):
        SecretSpec.parse({"type": "inline"}, role=None)
    with pytest.raises(ConfigError, match="available types: aws-secrets-manager"):
        get_secret("vault.x")


@pytest.mark.parametrize("env_vars,match", [
    ({"METAFLOW_X": "v"}, "disallowed"), ({"1BAD": "v"}, "invalid env var name"), ({"A": 1}, "non string value")])
def test_invalid_variables(env_vars, match):
    with pytest.raises(SecretsError, match=match):
        get_secret({"type": "inline", "id": "s", "options": {"env_vars": env_vars}})


def _step_with(**attrs):
    @secrets(**attrs)
    @step
    def start(self):
        pass

    return start


def test_sources_must_be_disjoint_and_new(monkeypatch):
    two = _step_with(sources=[{"type": "inline", "id": "a", "options": {"env_vars": {"K1": "v1"}}},
                              {"type": "inline", "id": "b", "options": {"env_vars": {"K1": "v2"}}}])
    with pytest.raises(SecretsError, match="also added by"):
        install_secrets(two)
    monkeypatch.setenv("K2", "old")
    existing = _step_with(sources=[{"type": "inline", "id": "a", "options": {"env_vars": {"K2": "new-value"}}}])
    with pytest.raises(SecretsError, match="already exists in env"):
        install_secrets(existing)
    override = _step_with(sources=[{"type": "inline", "id": "a", "options": {"env_vars": {"K2": "new-value"}}}],
                          allow_override=True)
    install_secrets(override)
    try:
        assert os.environ["K2"] == "new-value"
    finally:
        remove_secrets()
    assert os.environ["K2"] == "old"


def test_installed_values_are_redacted(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    func = _step_with(sources=[{"type": "inline", "id": "a", "options": {"env_vars": {"TOK": "value-31337"}}}])
    install_secrets(func)
    try:
        print("token:", os.environ["TOK"])
        assert redact_text("boom value-31337") == "boom ***"  # exceptions, @catch, manifests
    finally:
        remove_secrets()
    assert out.getvalue() == "token: ***\n"
    assert "TOK" not in os.environ and redact_text("value-31337") == "value-31337"
    assert "value-31337" not in repr(get_decorator(func, "secrets"))


# --- AWS Secrets Manager (moto's server) ----------------------------------------------------------------
def test_aws_secrets_manager(aws):
    sm = aws.client("secretsmanager")
    sm.create_secret(Name="app/creds", SecretString=json.dumps({"user-name": "u", "pass.word": 7}))
    sm.create_secret(Name="plain", SecretString="just-text")
    sm.create_secret(Name="blob", SecretBinary=b"\x00\x01")
    sm.create_secret(Name="not-json", SecretString="{oops")
    assert get_secret("aws-secrets-manager.app/creds") == {"user_name": "u", "pass_word": "7"}
    assert get_secret({"type": "aws-secrets-manager", "id": "plain", "options": {"json": False}}) == \
        {"plain": "just-text"}
    assert get_secret({"type": "aws-secrets-manager", "id": "plain",
                       "options": {"json": False, "env_var_name": "MY_VAR"}}) == {"MY_VAR": "just-text"}
    assert get_secret("aws-secrets-manager.blob") == {"blob": "AAE="}
    arn = sm.describe_secret(SecretId="plain")["ARN"]
    assert aws_secrets_manager_provider(arn, {"json": False}, None) == {"plain": "just-text"}
    role = "arn:aws:iam::123456789012:role/secrets-reader"
    assert get_secret({"type": "aws-secrets-manager", "id": "plain", "options": {"json": False}}, role=role) == \
        {"plain": "just-text"}  # the role is assumed first (STS)
    with pytest.raises(SecretsError, match="could not be parsed as JSON"):
        get_secret("aws-secrets-manager.not-json")
    with pytest.raises(SecretsError, match="failed to retrieve secret 'missing'.*ResourceNotFound"):
        get_secret("aws-secrets-manager.missing")
