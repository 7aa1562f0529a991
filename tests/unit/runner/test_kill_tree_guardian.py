"""A Runner's timeout kills the flow process and its descendants, but not the run's guardian: it is what
cancels the run's Slurm / Batch jobs once the run process is gone (killed too, they would run on)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from stoker.runner.process import GUARDIAN, kill_tree

PARENT = r"""
import subprocess, sys, time
sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
task = subprocess.Popen(sleep + ["task"])
guard = subprocess.Popen(sleep + [sys.argv[1]], start_new_session=True)
print(task.pid, guard.pid, flush=True)
time.sleep(60)
"""


def test_kill_tree_spares_the_guardian():
    parent = subprocess.Popen([sys.executable, "-c", PARENT, GUARDIAN], stdout=subprocess.PIPE, text=True)
    task_pid, guard_pid = map(int, parent.stdout.readline().split())
    try:
        kill_tree(parent.pid, grace=0.5)
        parent.wait(timeout=10)
        deadline = time.time() + 5
        while psutil.pid_exists(task_pid) and psutil.Process(task_pid).status() != psutil.STATUS_ZOMBIE \
                and time.time() < deadline:
            time.sleep(0.05)
        task_gone = not psutil.pid_exists(task_pid) or psutil.Process(task_pid).status() == psutil.STATUS_ZOMBIE
        assert task_gone, "a task process outlived kill_tree"
        assert psutil.pid_exists(guard_pid) and psutil.Process(guard_pid).status() != psutil.STATUS_ZOMBIE, \
            "the guardian was killed: the run's cluster jobs would never be cancelled"
    finally:
        for pid in (task_pid, guard_pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
