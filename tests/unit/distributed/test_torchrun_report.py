"""Issue 27: a preemption is an expected stop, so the live log gets one line per rank and no traceback: torchrun's
report of its workers' end (its log lines, ChildFailedError's or SignalException's traceback) is held back and
dropped when every worker stopped after a preemption, and written as it was for any other end."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
import time

import pytest

from stoker.distributed.torchrun_report import TorchrunStderr

ELASTIC = "W1206 11:22:10.514000 17035 torch/distributed/elastic/multiprocessing/api.py:1002]"
WORKERS = "[rank0] preempted: stopped by SIGTERM after step 5; checkpoint x is committed\n"


def _report(codes: tuple[int, ...]) -> str:
    table = "".join(f"[{i}]:\n  rank      : {i} (local_rank: {i})\n  exitcode  : {c} (pid: {100 + i})\n"
                    for i, c in enumerate(codes))
    return (f"{ELASTIC} Sending process 101 closing signal SIGTERM\n"
            f"{ELASTIC.replace('W', 'E', 1)} failed (exitcode: {codes[0]}) local_rank: 0 (pid: 100) of binary: py\n"
            "Traceback (most recent call last):\n  File \"<frozen runpy>\", line 198, in _run_module_as_main\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
            f"====\nstoker.train FAILED\n----\nFailures:\n{table}====\n")


def _pump(text: str, preempted: bool) -> tuple[str, str]:
    """(what was written before finish(), what was written in all) for torchrun's stderr `text`."""
    r, w = os.pipe()
    out = io.StringIO()
    report = TorchrunStderr(os.fdopen(r, "rb"), out)
    with os.fdopen(w, "wb") as f:
        f.write(text.encode())
    deadline = time.time() + 5
    while not report.held and time.time() < deadline and "Traceback" in text:
        time.sleep(0.01)
    before = out.getvalue()
    report.finish(preempted, node=1)
    return before, out.getvalue()


def test_an_expected_stop_drops_torchrun_report_and_keeps_the_workers_lines():
    before, after = _pump(WORKERS + _report((75, -15)), preempted=True)
    assert before == WORKERS  # everything before torchrun's report is written as it comes
    assert "Traceback" not in after and "ChildFailedError" not in after and "elastic" not in after
    assert after.startswith(WORKERS) and "torchrun: node 1: every worker stopped after a preemption" in after


@pytest.mark.parametrize("codes, preempted", [((75, 1), True), ((75, 75), False), ((1, -15), True)])
def test_any_other_end_keeps_the_report_as_it_was(codes, preempted):
    text = WORKERS + _report(codes)
    _, after = _pump(text, preempted)
    assert after == text


SCRIPT = textwrap.dedent("""
    import json, os, signal, sys, threading, time
    from pathlib import Path
    sys.path.insert(0, {root!r})
    from tests.unit.train.test_preemption import _config, _helper
    from tests.unit.train.test_parallel import token_file
    from stoker.errors import Preempted
    tmp = Path(sys.argv[1])
    cfg = _config(tmp, token_file(tmp / "tokens.bin"), "p")
    def stop_at_step_3():
        metrics = tmp / "p" / "metrics.jsonl"
        while not (metrics.exists() and metrics.read_text().strip()
                   and json.loads(metrics.read_text().splitlines()[-1]).get("step", 0) >= 3):
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)  # as a scheduler preempting the task
    threading.Thread(target=stop_at_step_3, daemon=True).start()
    try:
        _helper().run("stoker.train", args=["--config", str(cfg)], env={{"OMP_NUM_THREADS": "1"}})
    except Preempted as e:
        print("task: Preempted:", e, file=sys.stderr)
""")


@pytest.mark.slow
def test_a_real_preempted_torchrun_gang_logs_one_line_per_rank(tmp_path):
    """A real torchrun (2 ranks, gloo) whose task is sent SIGTERM mid-training: no traceback in the log."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    script = tmp_path / "preempt.py"
    script.write_text(SCRIPT.format(root=root))
    p = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=300)
    log = p.stdout + p.stderr
    assert "task: Preempted:" in log, log
    assert "Traceback" not in log and "ChildFailedError" not in log, log
    assert log.count("preempted: stopped by SIGTERM after step") == 2, log  # one line per rank
