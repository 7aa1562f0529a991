"""@project, config expressions and @secrets in real runs (stoker only): tasks started as new processes
(`_task`, as on Slurm or Batch) bind the same config values; a secret echoed in an exception is redacted from
the log, the manifest and the @catch artifact, and stored nowhere; a bad source fails the task."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.compat.engines import FLOWS, to_stoker

pytestmark = pytest.mark.slow

LEAK = "leak-8d1f-value"
LEAK_FLOW = f'''
import os
from stoker import FlowSpec, catch, secrets, step


class LeakFlow(FlowSpec):
    @catch(var="err")
    @secrets(sources=[{{"type": "inline", "id": "a", "options": {{"env_vars": {{"LEAK": "{LEAK}"}}}}}}])
    @step
    def start(self):
        print("value:", os.environ["LEAK"])
        raise RuntimeError("bad value " + os.environ["LEAK"])
        self.next(self.end)

    @secrets(sources=["vault.nothing"])
    @catch(var="fetch_err")
    @step
    def end(self):
        pass


if __name__ == "__main__":
    LeakFlow()
'''


def _run(folder: Path, flow: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, flow, *args], cwd=folder, capture_output=True, text=True, timeout=240,
                          env={**os.environ, **(env or {})})


def _client(folder: Path, code: str) -> str:
    p = subprocess.run([sys.executable, "-c", code], cwd=folder, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_project_and_configs_in_task_processes(tmp_path):
    (tmp_path / "flow.py").write_text(to_stoker((FLOWS / "project_config_flow.py").read_text()))
    p = _run(tmp_path, "flow.py", "--branch", "feat2", "run", env={"STOKER_TASK_LAUNCH": "subprocess"})
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Project: compat_proj, Branch: test.feat2" in p.stdout + p.stderr
    got = _client(tmp_path, "from stoker import Flow, namespace\nnamespace('project_branch:test.feat2')\n"
                            "r = Flow('ProjectConfigFlow').latest_run\n"
                            "print(r['start'].task.data.attempts, r['start'].task.data.greeting, r.data.mode, "
                            "r['start'].task.data.project['project_flow_name'])")
    assert got == "2 HELLO! fast compat_proj.test.feat2.ProjectConfigFlow"
    bad = _run(tmp_path, "flow.py", "--branch", "Not-Valid", "run")
    assert bad.returncode != 0 and "branch name must contain only lowercase" in bad.stdout + bad.stderr


def test_secret_in_exception_is_redacted_and_bad_source_fails(tmp_path):
    (tmp_path / "leak_flow.py").write_text(LEAK_FLOW)
    p = _run(tmp_path, "leak_flow.py", "run")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert LEAK not in out and "value: ***" in out and "bad value ***" in out
    assert "unknown secrets backend type vault" in out
    got = _client(tmp_path, "from stoker import Flow\nr = Flow('LeakFlow').latest_run\n"
                            "print(r['start'].task.data.err.exception)\nprint(r['end'].task.data.fetch_err.exception)")
    assert got.splitlines()[0] == "bad value ***"
    assert "unknown secrets backend type vault" in got.splitlines()[1]
    home = Path(os.environ["STOKER_HOME"])
    hits = [str(f) for f in home.rglob("*") if f.is_file() and LEAK.encode() in f.read_bytes()]
    assert hits == []
