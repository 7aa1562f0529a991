"""`python flow.py run` under user faults (issue 13): a missing --config file, a closed terminal (SIGHUP)."""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
import time

import psutil
import pytest

from stoker import Flow
from stoker.client.namespaces import NotFound
from tests.helpers import EXAMPLES, FLOWS, run_flow

PARSER_FLOW = '''
from stoker import Config, FlowSpec, step


def parse(text):
    return {"text": text}


class ParsedConfigFlow(FlowSpec):
    cfg = Config("cfg", default="defaults.toml", parser=parse)

    @step
    def start(self):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    ParsedConfigFlow()
'''


def test_missing_config_file_is_one_message_and_creates_nothing(tmp_path, _stoker_home):
    """A Config with its own parser used to die with a FileNotFoundError traceback (after creating the store)."""
    flow = tmp_path / "parsed_flow.py"
    flow.write_text(PARSER_FLOW)
    (tmp_path / "defaults.toml").write_text("x = 1\n")
    work = tmp_path / "work"
    work.mkdir()
    for path in (flow, FLOWS / "features_flow.py", EXAMPLES.parent / "src/stoker/recipes/llama_pretrain.py"):
        p = run_flow(path, "run", "--config", "missing.toml", cwd=work, check=False)
        assert p.returncode == 1, p.stderr
        assert "Traceback" not in p.stderr and "FileNotFoundError" not in p.stderr
        assert "--config missing.toml: no such file" in p.stderr and str(work / "missing.toml") in p.stderr
        assert "pass the path of an existing TOML or JSON file" in p.stderr
        assert not _stoker_home.exists()  # no store, no index, no run record
    # the default file of a parser Config missing: the same kind of message
    (tmp_path / "defaults.toml").unlink()
    p = run_flow(flow, "run", cwd=work, check=False)
    assert p.returncode == 1 and "Traceback" not in p.stderr and "defaults.toml does not exist" in p.stderr
    with pytest.raises(NotFound):  # no run recorded
        _ = Flow("ParsedConfigFlow").latest_run


def test_closed_terminal_sighup_stops_tasks_and_marks_the_run_killed(tmp_path):
    """The run's output goes to a real pseudo-terminal, which is closed (writes then fail with EIO) and SIGHUP
    is sent, as when a terminal window is closed."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, str(FLOWS / "sleepy_flow.py"), "run"], cwd=tmp_path,
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    out, deadline = b"", time.time() + 60
    try:
        while b"napping" not in out and time.time() < deadline:
            try:
                out += os.read(master, 4096)
            except OSError:
                break
        assert b"napping" in out, out.decode(errors="replace")
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children
    finally:
        os.close(master)  # the terminal is gone: writes to it fail with EIO from now on
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(timeout=30) == 130
    time.sleep(0.5)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    run = Flow("SleepyFlow").latest_run
    assert run.status == "killed" and run.finished
    p = subprocess.run([sys.executable, "-m", "stoker.cli.main", "runs", "SleepyFlow"], capture_output=True,
                       text=True, timeout=60)
    assert "killed" in p.stdout and "running" not in p.stdout, p.stdout
