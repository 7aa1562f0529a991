"""An artifact whose blob was changed after it was written (one byte flipped, same size) is never handed to a
step or printed: `python flow.py dump` fails with one line, and a resumed run that reads it fails instead of
finishing with a wrong result (issue 27)."""

from __future__ import annotations

import os
from pathlib import Path

from stoker import Flow
from stoker.store.blobs import blob_key_of
from tests.helpers import run_flow

FLOW = '''
import os

import numpy as np

from stoker import FlowSpec, step


class TamperFlow(FlowSpec):
    @step
    def start(self):
        self.arr = np.arange(10.0)
        self.next(self.middle)

    @step
    def middle(self):
        if not os.environ.get("TAMPER_OK"):
            raise RuntimeError("middle fails until TAMPER_OK is set")
        self.total = float(self.arr.sum())
        self.next(self.end)

    @step
    def end(self):
        print("total", self.total)


if __name__ == "__main__":
    TamperFlow()
'''


def _flow(tmp_path: Path) -> Path:
    path = tmp_path / "tamper_flow.py"
    path.write_text(FLOW)
    return path


def _flip_start_arr(run_id: str) -> None:
    """One byte of the blob of start's `arr` changed in place, its size the same."""
    key = Flow("TamperFlow")[run_id]["start"].task["arr"].sha
    blob = Path(os.environ["STOKER_HOME"]) / "store" / blob_key_of(key)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x5A
    os.chmod(blob, 0o644)
    blob.write_bytes(bytes(data))


def test_dump_of_a_tampered_artifact_fails_with_one_line(tmp_path):
    flow = _flow(tmp_path)
    run_flow(flow, "run", cwd=tmp_path, env={"TAMPER_OK": "1"})
    run_id = Flow("TamperFlow").latest_run.id
    ok = run_flow(flow, "dump", f"{run_id}/start", cwd=tmp_path)
    assert "arr [size: 80" in ok.stdout and "[0. 1. 2." in ok.stdout
    _flip_start_arr(run_id)
    p = run_flow(flow, "dump", f"{run_id}/start", cwd=tmp_path, check=False)
    assert p.returncode != 0, p.stdout + p.stderr
    assert "arr [" not in p.stdout  # nothing was printed for it
    errors = [line for line in p.stderr.splitlines() if "does not match its hash" in line]
    assert len(errors) == 1 and "changed after it was written" in errors[0] and "resume" in errors[0], p.stderr
    assert "Traceback" not in p.stderr


def test_resume_refuses_a_tampered_artifact(tmp_path):
    flow = _flow(tmp_path)
    first = run_flow(flow, "run", cwd=tmp_path, check=False)
    assert first.returncode != 0 and "middle fails" in first.stdout + first.stderr
    run_id = Flow("TamperFlow").latest_run.id
    _flip_start_arr(run_id)
    p = run_flow(flow, "resume", run_id, cwd=tmp_path, env={"TAMPER_OK": "1"}, check=False)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert "does not match its hash" in out and "changed after it was written" in out, out
    resumed = Flow("TamperFlow").latest_run
    assert resumed.id != run_id and not resumed.successful
    # the fix the message names: run the step that made the blob again (it rewrites the damaged blob)
    run_flow(flow, "resume", run_id, "--step", "start", cwd=tmp_path, env={"TAMPER_OK": "1"})
    fixed = Flow("TamperFlow").latest_run
    assert fixed.successful and fixed["middle"].task.data.total == 45.0
