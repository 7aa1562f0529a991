"""A task whose process dies: the console shows the last line it printed (even without a newline) and the
note saying how it died, and its stderr log has both on their own lines."""

from __future__ import annotations

import importlib.util
import sys

from stoker.backends.local.backend import LocalBackend
from stoker.runtime.driver import output as output_mod
from stoker.runtime.driver.launch import start_run

FLOW = '''
import os, signal, sys
from stoker import FlowSpec, step


class DiesFlow(FlowSpec):
    @step
    def start(self):
        sys.stderr.write("last words")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        self.next(self.end)

    @step
    def end(self):
        pass
'''


def test_dead_task_last_line_and_crash_note_reach_the_console(tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    shown: list[tuple[str, str]] = []
    monkeypatch.setattr(output_mod.Display, "line",
                        lambda self, step, prefix, text, stream="stdout": shown.append((stream, text)))
    path = tmp_path / "dies_flow.py"
    path.write_text(FLOW)
    spec = importlib.util.spec_from_file_location("dies_flow_r1", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    backend = LocalBackend(str(path), mode="fork")
    result = start_run(mod.DiesFlow, lambda step: backend, params={}, quiet=True, max_workers=2)
    assert result.status == "failed"
    err = [text for stream, text in shown if stream == "stderr"]
    assert "last words" in err, shown
    assert any(text.startswith("Task failed") and "SIGKILL" in text for text in err), shown
    from stoker.client import Run

    log = Run(f"DiesFlow/{result.run_id}", _namespace_check=False)["start"].task.stderr
    assert log.splitlines()[0] == "last words" and "SIGKILL" in log.splitlines()[1], log
