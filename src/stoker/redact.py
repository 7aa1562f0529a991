"""Redaction of secrets in what stoker stores or prints: environment values, secret parameters, command lines.

Names stay (they say what was set); values become ``***``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from stoker._environ import environ_copy

REDACTED = "***"
SECRET_ENV_PREFIX = "STOKER_SECRET_"  # the variables that carry secret parameters to a run's tasks
_WORDS = {"token", "secret", "password", "passwd", "pwd", "credential", "credentials", "apikey", "auth"}
_KEY_OWNERS = {"api", "access", "private", "secret", "signing"}


def is_secret_name(name: str) -> bool:
    """Whether a flag or setting names a credential: ``--token``, ``--api-key``, ``hf_token``,
    ``train.password``, ``aws_secret_access_key`` (not ``--tokenizer`` or ``max_tokens``)."""
    parts = [p for p in re.split(r"[-_.]+", name.strip("-").lower()) if p]
    return bool(_WORDS.intersection(parts)) or ("key" in parts and bool(_KEY_OWNERS.intersection(parts)))


def redact_env(env: Mapping[str, Any]) -> dict[str, str]:
    """Environment variables with their values hidden."""
    return {str(k): REDACTED for k in env}


def redact_with_spec(spec: str) -> str:
    """A ``--with NAME:k=v`` spec as it may be stored or printed: ``environment:vars={...}`` keeps the names
    of the variables only."""
    name, _, rest = spec.partition(":")
    if name.strip() != "environment" or not rest:
        return spec
    try:
        names = list(json.loads(rest.strip().removeprefix("vars=")))
    except (json.JSONDecodeError, TypeError, AttributeError):
        return f"{name}:{REDACTED}"  # not the JSON form: hide it all (this module sits below flow/'s parser)
    return f"{name}:vars=" + json.dumps(redact_env(dict.fromkeys(names)), separators=(",", ":"))


_KNOWN: list = [None, []]  # the environment they were found in, and the values


def known_secrets() -> list[str]:
    """Values of secret parameters in this process (their ``STOKER_SECRET_*`` variables), longest first."""
    environ = environ_copy()
    if _KNOWN[0] is not environ:
        _KNOWN[0], _KNOWN[1] = environ, _find_secrets(environ)
    return list(_KNOWN[1])


def _find_secrets(environ: Mapping[str, str]) -> list[str]:
    values: set[str] = set()
    for k, v in environ.items():
        if k.startswith(SECRET_ENV_PREFIX) and v:
            values.add(v)
            try:
                decoded = json.loads(v)
            except json.JSONDecodeError:
                continue
            if isinstance(decoded, (str, int, float)) and str(decoded):
                values.add(str(decoded))
    return sorted((s for s in values if len(s) >= 4), key=len, reverse=True)


def redact_text(text: str, secrets: Iterable[str] | None = None) -> str:
    """``text`` with every known secret value replaced by ``***``."""
    for s in known_secrets() if secrets is None else secrets:
        text = text.replace(s, REDACTED)
    return text


def redact_command(cmd: Iterable[str]) -> str:
    """A command line as it may go into a manifest or a log: the values of credential-looking flags and
    settings (``--token X``, ``--api-key=X``, ``train.hf_token=X``) and of secret parameters become ``***``."""
    out: list[str] = []
    hide_next = False
    secrets = known_secrets()
    for arg in map(str, cmd):
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        flag, eq, _ = arg.partition("=")
        if is_secret_name(flag) and " " not in flag:
            if eq:
                out.append(f"{flag}={REDACTED}")
                continue
            if arg.startswith("-"):
                out.append(arg)
                hide_next = True
                continue
        out.append(redact_text(arg, secrets))
    return " ".join(out)
