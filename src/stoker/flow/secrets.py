"""The sources of `@secrets(sources=[...])` (stoker.features.secrets) and `get_secret`, as Metaflow's.

A source is `"TYPE.ID"` (or `"ID"` with the default type from `$METAFLOW_DEFAULT_SECRETS_BACKEND_TYPE` /
`$STOKER_DEFAULT_SECRETS_BACKEND_TYPE`), or a dict `{"type", "id", "options", "role"}`. Types:

- `aws-secrets-manager`: a secret whose string is a JSON object gives one variable per key (`-`, `.` and `/`
  in keys become `_`); `options={"json": False}` gives the whole string as one variable named after the secret
  (or `options["env_var_name"]`); a binary secret is base64. Region: the ARN's, `options["region"]`,
  `$METAFLOW_AWS_SECRETS_MANAGER_DEFAULT_REGION`, else boto3's (`AWS_REGION` ...). `role` (the source's, the
  decorator's, `$METAFLOW_DEFAULT_SECRETS_ROLE`, `$METAFLOW_AWS_SECRETS_MANAGER_DEFAULT_ROLE`) is assumed first.
- `inline`: `options={"env_vars": {...}}` as they are (Metaflow's testing source; no store, no service).

The task fetches them just before the step runs; the values are never stored (not artifacts, not in a spec,
a manifest or the run record) and every value is `***` in what the task prints (its stdout/stderr and logs,
its exception and @catch): they join the values of secret Parameters in stoker's redaction (stoker.redact).
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Callable
from typing import Any

from stoker.errors import ConfigError, StokerError

DISALLOWED_PREFIXES = ("METAFLOW_", "STOKER_")
_ENV_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


class SecretsError(StokerError):
    """A secret could not be fetched, or does not give valid environment variables."""


def _conf(name: str) -> str | None:
    return os.environ.get(f"METAFLOW_{name}") or os.environ.get(f"STOKER_{name}") or None


class SecretSpec:
    """One source: backend type, secret id, options and role."""

    def __init__(self, backend: str, secret_id: str, options: dict | None = None, role: str | None = None):
        self.secrets_backend_type, self.secret_id = backend, secret_id
        self.options, self.role = dict(options or {}), role

    def __str__(self) -> str:
        return f"{self.secret_id} ({self.secrets_backend_type})"

    @staticmethod
    def parse(source: Any, role: str | None) -> SecretSpec:
        """A source as given to @secrets: `"[TYPE.]ID"` or `{"type", "id", "options", "role"}`."""
        if isinstance(source, str):
            parts = source.split(".", 1)
            return SecretSpec(default_backend() if len(parts) == 1 else parts[0], parts[-1], role=role)
        if not isinstance(source, dict):
            raise ConfigError("@secrets sources items must be either a string or a dict")
        backend = source.get("type") if "type" in source else default_backend()
        if not isinstance(backend, str):
            raise ConfigError(f"bad @secrets specification - 'type' must be a string - found {type(backend)}")
        if not isinstance(source.get("id"), str):
            raise ConfigError(f"bad @secrets specification - 'id' must be a string - found {type(source.get('id'))}")
        options = source.get("options", {})
        if not isinstance(options, dict):
            raise ConfigError(f"bad @secrets specification - 'options' must be a dict - found {type(options)}")
        own_role = source.get("role")
        if own_role is not None and not isinstance(own_role, str):
            raise ConfigError(f"bad @secrets specification - 'role' must be a str - found {type(own_role)}")
        return SecretSpec(backend, source["id"], options, own_role or role)


def default_backend() -> str:
    backend = _conf("DEFAULT_SECRETS_BACKEND_TYPE")
    if backend is None:
        raise ConfigError("no default secrets backend type configured, but needed by @secrets: write the source "
                          "as 'aws-secrets-manager.ID', or set METAFLOW_DEFAULT_SECRETS_BACKEND_TYPE")
    return backend


def inline_provider(secret_id: str, options: dict, role: str | None) -> dict[str, str]:
    """Metaflow's `inline` source (for testing): the `env_vars` option as it is."""
    return options.get("env_vars", {})


def aws_secrets_manager_provider(secret_id: str, options: dict, role: str | None,
                                 client: Any = None) -> dict[str, str]:
    """A secret of AWS Secrets Manager as environment variables (Metaflow's rules, see the module doc)."""
    if client is None:
        client = _secretsmanager_client(secret_id, options, role)
    response = client.get_secret_value(SecretId=secret_id)
    if "Name" not in response:
        raise SecretsError("secret 'Name' is missing in response")
    result: dict[str, str] = {}

    def add(key: str, value: str) -> None:
        name = key.replace("-", "_").replace(".", "_").replace("/", "_")
        if name in result:
            raise SecretsError(f"duplicate key in secret: '{key}' (sanitizes to '{name}')")
        result[name] = value

    env_var_name = options.get("env_var_name") or response["Name"]
    if "SecretString" in response:
        text = response["SecretString"]
        if options.get("json", True):
            try:
                obj = json.loads(text)
            except json.JSONDecodeError:
                raise SecretsError("secret string could not be parsed as JSON (pass options={'json': False} "
                                   "to get it as one variable)") from None
            if not isinstance(obj, dict):
                raise SecretsError(f"secret string is a JSON, but not an object (dict-like) - actual type "
                                   f"{type(obj)}")
            for k, v in obj.items():
                add(k, str(v))
        else:
            add(env_var_name, text)
    elif "SecretBinary" in response:
        add(env_var_name, base64.b64encode(response["SecretBinary"]).decode())
    else:
        raise SecretsError("secret response is missing both 'SecretString' and 'SecretBinary'")
    return result


def _secretsmanager_client(secret_id: str, options: dict, role: str | None) -> Any:
    try:
        import boto3
        from botocore.config import Config as BotoConfig
    except ImportError:
        raise ConfigError("@secrets with aws-secrets-manager needs boto3: pip install 'stoker[aws]'") from None
    m = re.match("arn:aws:secretsmanager:([^:]+):", secret_id)
    region = m.group(1) if m else options.get("region") or _conf("AWS_SECRETS_MANAGER_DEFAULT_REGION")
    role = role or _conf("AWS_SECRETS_MANAGER_DEFAULT_ROLE")
    config = BotoConfig(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=10, read_timeout=30)
    session = boto3.session.Session()
    if role:
        creds = session.client("sts", region_name=region or session.region_name, config=config).assume_role(
            RoleArn=role, RoleSessionName="stoker-secrets")["Credentials"]
        session = boto3.session.Session(aws_access_key_id=creds["AccessKeyId"],
                                        aws_secret_access_key=creds["SecretAccessKey"],
                                        aws_session_token=creds["SessionToken"])
    if not (region or session.region_name):
        raise ConfigError("default region is not specified for AWS Secrets Manager: set "
                          "METAFLOW_AWS_SECRETS_MANAGER_DEFAULT_REGION or AWS_REGION, or use the secret's ARN")
    return session.client("secretsmanager", region_name=region or session.region_name, config=config)


PROVIDERS: dict[str, Callable[[str, dict, str | None], dict[str, str]]] = {
    "inline": inline_provider,
    "aws-secrets-manager": aws_secrets_manager_provider,
}


def register_secrets_provider(backend: str, provider: Callable[[str, dict, str | None], dict[str, str]]) -> None:
    """Add a source type: `provider(secret_id, options, role) -> {ENV_NAME: value}`."""
    PROVIDERS[backend] = provider


def _fetch(spec: SecretSpec) -> dict[str, str]:
    provider = PROVIDERS.get(spec.secrets_backend_type)
    if provider is None:
        known = ", ".join(k for k in PROVIDERS if k != "inline")
        raise ConfigError(f"unknown secrets backend type {spec.secrets_backend_type} (available types: {known})")
    try:
        values = provider(spec.secret_id, spec.options, spec.role)
    except Exception as e:  # noqa: BLE001 - any failure of the backend: name the secret, keep its words
        err = (getattr(e, "response", None) or {}).get("Error", {})
        why = f"{err.get('Code')}: {err.get('Message')}" if err else str(e)
        raise SecretsError(f"failed to retrieve secret '{spec.secret_id}': {why}") from None
    _validate(spec, values)
    return dict(values)


def _validate(spec: SecretSpec, values: dict) -> None:
    for k, v in values.items():
        what = f"invalid env vars from secret {spec.secret_id}"
        if not isinstance(k, str):
            raise SecretsError(f"{what}: found non string key {k!s} ({type(k)})")
        if not isinstance(v, str):
            raise SecretsError(f"{what}: found non string value for {k} ({type(v)})")  # never the value
        if not _ENV_NAME.fullmatch(k):
            raise SecretsError(f"{what}: found invalid env var name '{k}'")
        prefix = next((p for p in DISALLOWED_PREFIXES if k.startswith(p)), None)
        if prefix:
            raise SecretsError(f"{what}: found disallowed env var name '{k}' (starts with '{prefix}')")


def get_secret(source: str | dict, role: str | None = None) -> dict[str, str]:
    """Fetch one source now (Metaflow's get_secret): {ENV_NAME: value}."""
    return _fetch(SecretSpec.parse(source, role if role is not None else _conf("DEFAULT_SECRETS_ROLE")))
