"""`@secrets(sources=[...])`: secrets as environment variables of a step's task, as Metaflow's @secrets.

The task fetches them just before the step runs (the sources are in stoker.flow.secrets); the values are never
stored and every value is `***` in what the task prints, its exception and @catch, until the task ends.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from stoker.errors import ConfigError
from stoker.flow.decorators import StepCall, StepDecorator, TaskContext, get_decorator, make_step_decorator
from stoker.flow.secrets import SecretsError, SecretSpec, _conf, _fetch, get_secret
from stoker.redact import REDACTED, SECRET_ENV_PREFIX, redact_text

__all__ = ["SecretsDecorator", "get_secret", "install_secrets", "remove_secrets", "secrets"]
REDACT_ENV = SECRET_ENV_PREFIX + "_SECRETS_"  # + NAME: what stoker.redact knows of a fetched value


class SecretsDecorator(StepDecorator):
    """Fetch secrets into the task's environment before the step runs: `sources` (list of "TYPE.ID" or
    {"type", "id", "options", "role"}), `role` (for every source without its own), `allow_override` (a secret may
    replace an existing variable)."""

    name = "secrets"
    defaults = {"sources": [], "role": None, "allow_override": False}
    order = 10  # nearest the step: fetched inside @timeout, not at all in @catch's fallback attempt

    def validate(self) -> None:
        sources = self.attributes["sources"]
        if isinstance(sources, (str, dict)):
            sources = [sources]
        if not isinstance(sources, (list, tuple)):
            raise ConfigError("@secrets(sources=...) takes a list of sources, e.g. "
                              "sources=['aws-secrets-manager.my-secret']")
        self.attributes["sources"] = list(sources)
        for s in self.attributes["sources"]:
            if not isinstance(s, (str, dict)):
                raise ConfigError("@secrets sources items must be either a string or a dict")

    def fetch(self) -> dict[str, str]:
        """Every source's variables, checked as Metaflow checks them (disjoint, and new unless allow_override)."""
        role = self.attributes["role"] or _conf("DEFAULT_SECRETS_ROLE")
        fetched = [(spec, _fetch(spec)) for spec in (SecretSpec.parse(s, role) for s in self.attributes["sources"])]
        by: dict[str, SecretSpec] = {}
        for spec, values in fetched:
            for k in values:
                if k in by:
                    raise SecretsError(f"secret '{spec}' will inject '{k}' as env var, and it is also added by "
                                       f"'{by[k]}'")
                by[k] = spec
                if not self.attributes["allow_override"] and k in os.environ:
                    raise SecretsError(f"secret '{spec}' will inject '{k}' as env var, but it already exists in "
                                       f"env (pass allow_override=True to replace it)")
        return {k: v for _, values in fetched for k, v in values.items()}

    def task_decorate(self, ctx: TaskContext, call: StepCall) -> StepCall:
        def run() -> Any:  # fetched just before the step (a failure fails the task), never stored
            _install(self)
            return call()

        return run

    def task_finished(self, ctx: TaskContext) -> None:
        remove_secrets()  # last (lowest order): what the other hooks print at the end is still redacted

    def __repr__(self) -> str:  # printed by `show`: where the secrets come from, never a value
        shown = [s if isinstance(s, str) else {k: (REDACTED if k == "options" else v) for k, v in s.items()}
                 for s in self.attributes["sources"]] if isinstance(self.attributes["sources"], list) else "..."
        return f"@secrets(sources={shown!r})"


class _RedactingStream:
    """sys.stdout / sys.stderr of a task with secrets: every fetched value is written as ***."""

    def __init__(self, stream: Any, values: list[str]) -> None:
        self._stream, self._values = stream, values

    def write(self, text: str) -> int:
        self._stream.write(redact_text(text, self._values))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


_installed: dict[str, Any] = {}


def install_secrets(func: Callable) -> None:
    """In a task, before its step runs: fetch the step's @secrets into os.environ and have every value
    redacted from what the task prints and records. Raises SecretsError (the task fails, @retry applies)."""
    deco = get_decorator(func, "secrets")
    if deco is not None:
        _install(deco)


def _install(deco: SecretsDecorator) -> None:
    values = deco.fetch()
    keys = [*values, *(f"{REDACT_ENV}{k}" for k in values)]
    _installed.update(old={k: os.environ.get(k) for k in keys}, stdout=sys.stdout, stderr=sys.stderr)
    os.environ.update(values)
    # stoker.redact knows secret values by their STOKER_SECRET_* variables: the exception, @catch and the log
    redact_env = {f"{REDACT_ENV}{k}": v for k, v in values.items()}
    os.environ.update(redact_env)
    secret_values = sorted({v for v in values.values() if len(v) >= 4}, key=len, reverse=True)
    if secret_values:
        sys.stdout = _RedactingStream(sys.stdout, secret_values)  # type: ignore[assignment]
        sys.stderr = _RedactingStream(sys.stderr, secret_values)  # type: ignore[assignment]


def remove_secrets() -> None:
    """After the task: its secrets leave os.environ and the streams are the task's own again."""
    if not _installed:
        return
    for k, old in _installed["old"].items():
        if old is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = old
    sys.stdout, sys.stderr = _installed["stdout"], _installed["stderr"]
    _installed.clear()


secrets = make_step_decorator(SecretsDecorator)
