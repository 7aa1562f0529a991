"""What a failed task's exit code means to the scheduler (issue 13): a preemption (75) is retried without
using up @retry and resumes; a deterministic error (78, ConfigError) is never retried and ends with one line and
a "fix it and run again" hint; and task processes that ignore SIGTERM do not outlive a scheduler killed with -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from stoker import Flow
from tests.helpers import FLOWS, run_flow


def test_a_preempted_task_is_retried_without_retry_budget_and_resumes(tmp_path):
    p = run_flow("preempt_flow.py", "run", "--mode", "preempt", "--scratch", str(tmp_path), cwd=tmp_path,
                 env={"STOKER_MAX_PREEMPTIONS": "1"})
    assert "preempted; resuming from step 3 (preemption 1 of at most 1)" in p.stdout + p.stderr
    run = Flow("PreemptFlow").latest_run
    work = run["work"].task
    first = work.attempts[0].stderr  # an expected stop is one line, no traceback (issue 27)
    assert "Traceback" not in first and "Preempted: stopped by SIGTERM after step 3" in first, first
    assert work.data.resumed_from == 3 and work.data.steps == 6
    assert [a.successful for a in work.attempts] == [False, True]


def test_a_bare_exit_75_is_a_preemption_and_preemptions_are_capped(tmp_path):
    """Two preemptions but at most one free retry: the second is an ordinary failure that uses @retry."""
    p = run_flow("preempt_flow.py", "run", "--mode", "exit75", "--scratch", str(tmp_path), cwd=tmp_path,
                 env={"STOKER_MAX_PREEMPTIONS": "1"})
    out = p.stdout + p.stderr
    assert "preempted; resuming from its last checkpoint (preemption 1 of at most 1)" in out
    assert "retry 2 of 4" in out, out  # @retry(times=3) plus the free preemption retry
    assert Flow("PreemptFlow").latest_run.successful


def test_a_config_error_is_not_retried_and_says_fix_and_run_again(tmp_path):
    t0 = time.time()
    p = run_flow("preempt_flow.py", "run", "--mode", "config", "--scratch", str(tmp_path), cwd=tmp_path,
                 check=False)
    out = p.stdout + p.stderr
    assert p.returncode == 1 and time.time() - t0 < 20
    assert "retry" not in out.split("train.stepz", 1)[1].lower() or "not retried" in out
    assert "retry 1 of" not in out
    assert "failed after 1 attempt(s): ConfigError: train.stepz is not a setting" in out
    assert "fix it and run again" in out and "resume" not in out.split("failed after", 1)[1]
    tail = out.split("failed after", 1)[1]
    assert "Traceback" not in tail
    assert len(Flow("PreemptFlow").latest_run["work"].task.attempts) == 1


def test_tasks_that_ignore_sigterm_die_when_the_scheduler_is_killed(tmp_path):
    env = {**os.environ, "STOKER_KILL_GRACE": "2"}
    run = subprocess.Popen([sys.executable, str(FLOWS / "preempt_flow.py"), "run", "--mode", "stubborn",
                            "--scratch", str(tmp_path)], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    pid_file = tmp_path / "pid"
    deadline = time.time() + 60
    while not pid_file.exists() and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(0.3)
    task = psutil.Process(int(pid_file.read_text()))
    assert task.is_running()
    run.send_signal(signal.SIGKILL)
    run.wait()
    t0 = time.time()
    gone, alive = psutil.wait_procs([task], timeout=2 + 8)
    assert not alive, "the task ignored SIGTERM and outlived the killed scheduler"
    assert time.time() - t0 >= 1.5, "SIGTERM alone cannot have stopped it: the grace was given first"


def test_a_second_ctrl_c_kills_tasks_that_are_still_in_their_grace(tmp_path):
    """The first Ctrl-C gives tasks the grace to save a checkpoint ($STOKER_KILL_GRACE, here 60 s); one that ignores
    SIGTERM would hold the run that long. A second Ctrl-C kills it at once."""
    env = {**os.environ, "STOKER_KILL_GRACE": "60"}
    run = subprocess.Popen([sys.executable, str(FLOWS / "preempt_flow.py"), "run", "--mode", "stubborn",
                            "--scratch", str(tmp_path)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    pid_file = tmp_path / "pid"
    deadline = time.time() + 60
    while not pid_file.exists() and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(0.3)
    task = psutil.Process(int(pid_file.read_text()))
    run.send_signal(signal.SIGINT)
    time.sleep(1.5)
    assert task.is_running(), "the stubborn task is still in its grace"
    t0 = time.time()
    run.send_signal(signal.SIGINT)
    out, _ = run.communicate(timeout=20)
    assert time.time() - t0 < 15 and run.returncode == 130
    assert not task.is_running() or task.status() == psutil.STATUS_ZOMBIE
    assert "Ctrl-C again to kill them now" in out and "killing all tasks now" in out


def test_a_manifest_signed_with_another_key_is_named_not_hidden_behind_an_exit_code(tmp_path):
    """A node with the wrong key writes a manifest the scheduler cannot verify: the failure says so and names the
    key to fix, instead of overwriting it with "task process exited with code 0"."""
    p = subprocess.run([sys.executable, str(FLOWS / "other_key_flow.py"), "run"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "UntrustedManifest: its manifest cannot be trusted" in p.stderr + p.stdout
    assert "signed with another key" in p.stderr + p.stdout and "exited with code" not in p.stderr + p.stdout
