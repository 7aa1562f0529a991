"""Issue 33 item 3, stacks and hangs, on the local backend with real processes: a @torchrun gang (gloo) whose rank 1
never joins the all_reduce rank 0 waits in is stopped as `hang` within its hang timeout, with the stacks of both ranks
recorded (`stoker logs --stacks`) and named in `stoker show`; while it hangs, `stoker stacks` shows the stuck frames;
a plain task stuck in user code is stopped by its @timeout(hang=) and retried by @retry. One gang run covers both
the live stacks and the stop (a gang's start-up is most of its time)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from stoker import Flow
from stoker.distributed.rankstacks import parse
from stoker.exitstatus import EXIT_HANG
from stoker.runtime.driver.causes import classify
from tests.helpers import FLOWS, run_flow
from tests.integration.test_slurm_faults import _start

pytestmark = [pytest.mark.slow, pytest.mark.torch]
HANG_S = 10


def cli(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stoker.cli.main", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=60)


def check_hung_gang(out, started: float, joined: float, ended: float, cwd) -> None:
    """What a gang stopped as hung leaves: cause, timing, stacks, `stoker show`."""
    assert ended - joined < HANG_S + 6, f"stopped {ended - joined:.1f} s after the ranks' last output\n{out.text}"
    run = Flow("HangFlow").latest_run
    [attempt] = list(run["train"])[0].attempts
    assert attempt.exception.cause == "hang", attempt.exception
    assert f"no progress for {HANG_S}" in attempt.exception.evidence
    stacks = cli("logs", f"{run.pathspec}/train", "--stacks", cwd=cwd).stdout
    for frame in ("rank_one_never_joins", "rank_zero_waits_in_all_reduce", "rank 1 pid", "rank 0 pid"):
        assert frame in stacks, stacks
    assert "rank_one_never_joins" in out.text  # in the task's log too
    shown = " ".join(cli("show", run.pathspec, cwd=cwd).stdout.split())
    assert "failed: hang (no progress): TaskHang: no progress for" in shown, shown


@pytest.mark.timeout(90)
def test_a_deadlocked_gang_shows_its_stacks_then_is_stopped_as_hang(tmp_path):
    t0 = time.time()
    proc, out = _start(FLOWS / "hang_flow.py", "--hang-timeout", str(HANG_S), "--no-preflight", cwd=tmp_path)
    try:
        joined = max(out.wait_for("rank 1 joined", 60), out.wait_for("rank 0 joined", 5))
        run = Flow("HangFlow").latest_run
        p = cli("stacks", run.pathspec, cwd=tmp_path)  # while it hangs
        assert p.returncode == 0, p.stdout + p.stderr
        for frame in ("rank_one_never_joins", "rank_zero_waits_in_all_reduce", "work.wait()",
                      f"[{run.pathspec}/train/", " rank 1 pid ", " task pid ", "Traceback (most recent call last):"):
            assert frame in p.stdout, p.stdout
        step = cli("stacks", f"{run.pathspec}/start", cwd=tmp_path)
        assert step.returncode == 1 and "has no live tasks" in step.stdout, step.stdout
        ended = out.wait_for("failed after 1 attempt", HANG_S + 30)
        assert proc.wait(30) == 1
    finally:
        if proc.poll() is None:
            cli("kill", Flow("HangFlow").latest_run.pathspec, cwd=tmp_path)
            proc.wait(60)
    check_hung_gang(out, t0, joined, ended, tmp_path)
    done = cli("stacks", run.pathspec, cwd=tmp_path)
    assert done.returncode == 1 and "has no live tasks: the run is failed" in done.stdout, done.stdout


@pytest.mark.timeout(60)
def test_a_plain_task_stuck_in_user_code_is_stopped_as_hang_and_retried(tmp_path):
    t0 = time.time()
    run_flow("hang_plain_flow.py", "run", cwd=tmp_path, timeout=50)
    assert time.time() - t0 < 3 + 25
    task = Flow("HangPlainFlow").latest_run["start"].task
    failed, ok = task.attempts
    assert failed.exception.cause == "hang" and ok.successful
    stacks = cli("logs", task.pathspec, "--stacks", cwd=tmp_path).stdout
    assert "wait_for_a_lock_nobody_releases" in stacks and "lock.acquire()" in stacks, stacks


def test_hang_causes_and_faulthandler_dumps_are_read():
    m = {"status": "failed", "exception": {"type": "TaskHang", "message": "no progress for 6 s"}}
    assert classify(m).kind == "hang"
    died = {"status": "failed", "exception": {"type": "TaskDied", "message": "task process exited with code 79"}}
    assert classify(died, type("S", (), {"exit_code": EXIT_HANG, "reason": ""})()).kind == "hang"
    dump = ('Thread 0x00000000000000aa (most recent call first):\n  File "/x.py", line 3 in inner\n'
            '  File "/x.py", line 9 in outer\n\nCurrent thread 0x00000000000000bb (most recent call first):\n'
            '  File "/y.py", line 1 in <module>\n')
    assert parse(dump, main=0xAA) == [("MainThread", [("/x.py", 9, "outer"), ("/x.py", 3, "inner")]),
                                     ("0x00000000000000bb (it received the signal)", [("/y.py", 1, "<module>")])]


def test_a_hung_attempts_silence_is_booked_as_hang_in_the_ledger():
    from stoker.client.goodput import CATEGORIES, _book_hang

    sec = {**dict.fromkeys(CATEGORIES, 0.0), "startup": 20.0, "productive": 100.0, "shutdown": 30.0}
    m = {"exception": {"type": "TaskHang", "cause": "hang", "message": "no progress for 45 s (hang timeout 45 s)"}}
    _book_hang(sec, m)
    assert (sec["hang"], sec["shutdown"], sec["startup"], sec["productive"]) == (45.0, 0.0, 5.0, 100.0)
    untouched = {**dict.fromkeys(CATEGORIES, 0.0), "shutdown": 30.0}
    _book_hang(untouched, {"exception": {"type": "ValueError", "cause": "user", "message": "no progress for 9 s"}})
    assert untouched["hang"] == 0.0 and untouched["shutdown"] == 30.0
