"""stoker's Runner API on its own: options from keyword arguments, the runner attribute file, a timeout that
stops the run, and NBRunner's flow file from a cell (the side-by-side checks are tests/compat/test_runner.py)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from stoker import NBRunner, Runner
from stoker.runner.nbrun import format_flowfile
from stoker.runner.runner import RESUME, RUN, TOP_LEVEL, _options
from tests.helpers import FLOWS

FLOW = FLOWS / "metaflow" / "runner_flow.py"


@pytest.fixture
def flow_file(tmp_path: Path) -> Path:
    path = tmp_path / "runner_flow.py"
    path.write_text(FLOW.read_text().replace("from metaflow import", "from stoker import"))
    return path


def test_keyword_arguments_become_options(flow_file: Path):
    runner = Runner(str(flow_file), show_output=False, pylint=False, decospecs=["retry:times=1"], quiet=True)
    cmd = runner._command("run", {"alpha": 5, "loud": False, "extra": {"k": 1}, "tags": ["a", "b"],
                                  "max_workers": 2}, "/tmp/fifo")
    assert cmd[:2] == [sys.executable, str(flow_file)]
    assert cmd[2:cmd.index("run")] == ["--no-pylint", "--with", "retry:times=1"]
    rest = cmd[cmd.index("run") + 1:]
    assert rest == ["--alpha", "5", "--no-loud", "--extra", '{"k": 1}', "--tag", "a", "--tag", "b",
                    "--max-workers", "2", "--quiet", "--runner-attribute-file", "/tmp/fifo"]
    assert _options({"step_to_rerun": "middle", "origin_run_id": "12"}, RESUME, {}) == \
        ["middle", "--origin-run-id", "12"]
    assert _options({"config": [("cfg", "a.toml")]}, TOP_LEVEL, {}) == ["--config", "cfg", "a.toml"]
    valued = Runner(str(flow_file), show_output=False, config_value=[("cfg", {"lr": 0.1}), ("other", "{}")])
    assert valued._top[0] == ["--config-value", "cfg", '{"lr": 0.1}', "--config-value", "other", "{}"]
    with pytest.raises(ValueError, match="Unknown argument: 'nope'"):
        _options({"nope": 1}, RUN, {})
    with pytest.raises(ValueError, match="'user_namespace' is a Metaflow option stoker does not support"):
        _options({"user_namespace": "me"}, RUN, {})  # stoker's `run` has no --namespace: refused up front
    with pytest.raises(TypeError, match="Invalid type for 'alpha'"):
        runner._command("run", {"alpha": "5"}, "/tmp/fifo")


def test_runner_attribute_file_names_the_run(flow_file: Path, tmp_path: Path):
    attrs = tmp_path / "attrs.json"
    p = subprocess.run([sys.executable, str(flow_file), "run", "--runner-attribute-file", str(attrs)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    got = json.loads(attrs.read_text())
    assert got["flow_name"] == "RunnerFlow" and got["run_id"] in p.stdout and got["metadata"].startswith("local@")
    from stoker import Flow

    assert Flow("RunnerFlow").latest_run.id == got["run_id"]


def test_the_run_is_read_where_the_flow_process_wrote_it(flow_file: Path, tmp_path: Path):
    other = tmp_path / "elsewhere"
    with Runner(str(flow_file), show_output=False, env={"STOKER_HOME": str(other)}).run(alpha=2) as running:
        assert running.status == "successful" and running.run.data.doubled == 4
        assert str(other) in running.run._db.path.as_posix()
    from stoker import Flow, MetaflowNotFound

    with pytest.raises(MetaflowNotFound):
        Flow("RunnerFlow")  # not in this process's home


def test_wait_timeout_stops_the_run(tmp_path: Path):
    async def main() -> tuple[str, int | None, str]:
        async with Runner(str(FLOWS / "sleepy_flow.py"), show_output=False, cwd=str(tmp_path)) as runner:
            running = await runner.async_run()
            await running.wait(timeout=3)
            return running.status, running.returncode, running.run.status

    status, code, run_status = asyncio.run(main())
    assert status == "timeout" and code is not None and code != 0
    assert run_status in ("killed", "failed")


def test_nbrunner_needs_ipython_and_writes_the_cell(monkeypatch, tmp_path: Path):
    cell = ("from stoker import FlowSpec, step\n\nclass C(FlowSpec):\n    @step\n    def start(self):\n"
            "        self.next(self.end)\n\n    @step\n    def end(self):\n        pass\n\nC.something()\n")
    text = format_flowfile(cell)
    assert text.endswith("if __name__ == '__main__':\n    C()") and "something" not in text
    with pytest.raises(ModuleNotFoundError, match="FlowSpec"):
        format_flowfile("x = 1\n")
    monkeypatch.setitem(sys.modules, "IPython", None)  # not in a notebook
    from stoker.runner import NBRunnerInitializationError

    with pytest.raises(NBRunnerInitializationError, match="interactive Python"):
        NBRunner(object)
