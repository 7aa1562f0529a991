"""A user tag that looks like @project's system tag (`--tag project:other`) is refused before anything runs (issue
27: system-tag prefixes are reserved), on the Python path as on the command line; the user's own tags reach
`current.tags` and leave `current.project_name` alone (Metaflow: current.tags are the user tags)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from stoker.backends.local.backend import LocalBackend
from stoker.runtime.driver.launch import start_run

FLOW = '''
from stoker import FlowSpec, current, project, step


@project(name="real")
class TagProjectFlow(FlowSpec):
    @step
    def start(self):
        self.project = current.project_name
        self.branch = current.branch_name
        self.tags = sorted(current.tags)
        self.next(self.end)

    @step
    def end(self):
        pass
'''


def test_user_tag_named_like_a_project_tag(tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("USER", "alice")
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "tag_project_flow.py"
    path.write_text(FLOW)
    spec = importlib.util.spec_from_file_location("tag_project_flow_r1", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    backend = LocalBackend(str(path), mode="fork")
    from stoker.errors import ConfigError

    for bad in ("project:other", "project_branch:x", "user:mallory"):
        with pytest.raises(ConfigError, match="system tags"):
            start_run(mod.TagProjectFlow, lambda step: backend, params={}, quiet=True, tags=[bad, "plain"])
    with pytest.raises(ConfigError, match="max_workers=0"):
        start_run(mod.TagProjectFlow, lambda step: backend, params={}, quiet=True, max_workers=0)
    result = start_run(mod.TagProjectFlow, lambda step: backend, params={}, quiet=True, max_workers=2,
                       tags=["plain", "user:alice"])
    assert result.status == "succeeded", result.failures
    from stoker.client import Run

    data = Run(f"TagProjectFlow/{result.run_id}", _namespace_check=False)["start"].task.data
    assert (data.project, data.branch) == ("real", "user.alice")
    assert data.tags == ["plain", "user:alice"]


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])
