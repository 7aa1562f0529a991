"""Metaflow's options before the command: accepted, or refused in one line with what stoker uses instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stoker.cli.flow_cli import COMMANDS
from stoker.cli.top_options import TopOptionError, split_top_options

FLOW = '''
from stoker import FlowSpec, Parameter, step


class EnvFlow(FlowSpec):
    size = Parameter("size", default=1, type=int)

    @step
    def start(self):
        with open("size.txt", "w") as f:
            f.write(str(self.size))
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    EnvFlow()
'''


def test_accepted_options_are_taken_off():
    argv = ["--quiet", "--no-pylint", "--metadata=local", "--datastore", "local", "--environment=local",
            "--event-logger", "debugLogger", "--monitor=nullSidecarMonitor", "--package-suffixes", ".py",
            "--force-rebuild-environments", "--with", "retry", "run", "--metadata", "x"]
    rest, top = split_top_options(argv, COMMANDS)
    assert rest == ["--with", "retry", "run", "--metadata", "x"]  # after the command: the command's business
    assert top.quiet and top.datastore == "local"


@pytest.mark.parametrize("argv, words", [
    (["--metadata=service", "run"], "no metadata service"),
    (["--datastore", "azure", "run"], "Azure"),
    (["--datastore=gs", "run"], "Google"),
    (["--environment=conda", "run"], "install the packages"),
    (["--environment", "pypi", "run"], "install the packages"),
    (["--mode=spin", "run"], "resume --step"),
    (["--datastore=nope", "run"], "not one of"),
    (["--monitor=x", "run"], "not one of"),
    (["--local-config-file", "f.json", "run"], "--config NAME PATH"),
    (["--datastore"], "needs a value"),
])
def test_refused_options_say_why(argv, words):
    with pytest.raises(TopOptionError, match=words) as e:
        split_top_options(argv, COMMANDS)
    assert e.value.exit_code == 2 and "\n" not in str(e.value)


def test_datastore_s3_needs_a_bucket():
    _, top = split_top_options(["--datastore=s3", "run"], COMMANDS)
    with pytest.raises(TopOptionError, match="--datastore-root s3://BUCKET/PREFIX"):
        top.apply({"STOKER_STORE": "/a/folder"})
    env: dict[str, str] = {"METAFLOW_DATASTORE_SYSROOT_S3": "s3://mf/root"}
    top.apply(env)
    assert env["STOKER_STORE"] == "s3://mf/root"
    _, top = split_top_options(["--datastore=s3", "--datastore-root", "s3://b/p", "run"], COMMANDS)
    top.apply(env)
    assert env["STOKER_STORE"] == "s3://b/p"


def test_datastore_root_is_the_store(tmp_path):
    env: dict[str, str] = {}
    _, top = split_top_options([f"--datastore-root={tmp_path}/blobs", "run"], COMMANDS)
    top.apply(env)
    assert env == {"STOKER_STORE": f"{tmp_path}/blobs"}
    _, top = split_top_options(["--datastore-root=s3://b/p", "run"], COMMANDS)
    with pytest.raises(TopOptionError, match="add --datastore s3"):
        top.apply(env)


def _run(tmp_path: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    (tmp_path / "env_flow.py").write_text(FLOW)
    full = {k: v for k, v in os.environ.items() if not k.startswith(("STOKER_PARAM_", "METAFLOW_RUN_"))}
    full.update(STOKER_HOME=str(tmp_path / "home"), **env)
    return subprocess.run([sys.executable, "env_flow.py", *args], cwd=tmp_path, env=full, capture_output=True,
                          text=True, timeout=120)


def test_stoker_run_prefix_and_refusal_end_to_end(tmp_path):
    proc = _run(tmp_path, "--quiet", "run", env={"STOKER_PARAM_SIZE": "5", "METAFLOW_RUN_SIZE": "6"})
    assert proc.returncode == 0 and (tmp_path / "size.txt").read_text() == "5", proc.stderr
    assert "size" not in proc.stdout  # --quiet: only the run's start and end
    proc = _run(tmp_path, "run", "--size", "4", env={"STOKER_PARAM_SIZE": "5"})
    assert proc.returncode == 0 and (tmp_path / "size.txt").read_text() == "4", proc.stderr
    proc = _run(tmp_path, "--metadata", "service", "run", env={})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "metadata service" in proc.stderr
