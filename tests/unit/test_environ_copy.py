"""stoker._environ.environ_copy: the environment copied again only when it changed (a 10,000-way foreach asked
for it per task: ~80 decodes and a pickled dict each time), and the secrets found in it follow a change."""

from __future__ import annotations

from stoker._environ import environ_copy
from stoker.redact import known_secrets


def test_the_same_copy_until_the_environment_changes(monkeypatch):
    first = environ_copy()
    assert environ_copy() is first and first == dict(__import__("os").environ)
    monkeypatch.setenv("STOKER_TEST_ENV_COPY", "1")
    second = environ_copy()
    assert second is not first and second["STOKER_TEST_ENV_COPY"] == "1"
    monkeypatch.delenv("STOKER_TEST_ENV_COPY")
    assert "STOKER_TEST_ENV_COPY" not in environ_copy()


def test_secret_values_follow_the_environment(monkeypatch):
    monkeypatch.delenv("STOKER_SECRET_TEST_TOKEN", raising=False)
    assert "hunter2-value" not in known_secrets()
    monkeypatch.setenv("STOKER_SECRET_TEST_TOKEN", '"hunter2-value"')
    assert "hunter2-value" in known_secrets()
    monkeypatch.setenv("STOKER_SECRET_TEST_TOKEN", '"other-value"')
    found = known_secrets()
    assert "other-value" in found and "hunter2-value" not in found
