"""Issue 33 item 3 on AWS Batch, emulated (tests/batch_emulator.py: moto's Batch, S3 and CloudWatch Logs on loopback,
each node a local process with Batch's environment): the only way to a Batch node is the store, so `stoker stacks`
reaches a hung 2-node gang through S3, and the nodes' watchdogs stop it as `hang` with their stacks kept in S3."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.integration.test_batch_emulation import _run_id, batch_env  # noqa: F401 - the fixture

pytestmark = [pytest.mark.aws, pytest.mark.slow]
HANG_S = 20

STUCK = """
import threading
from stoker import FlowSpec, batch, parallel, step, timeout


def stuck_in_user_code():
    threading.Event().wait()


class Stuck(FlowSpec):
    @step
    def start(self):
        self.next(self.work, num_parallel=2)

    @timeout(hang=HANG_S)
    @batch(cpu=1)
    @parallel
    @step
    def work(self):
        print("working", flush=True)
        stuck_in_user_code()
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    Stuck()
""".replace("HANG_S", str(HANG_S))


@pytest.mark.timeout(240)
def test_stacks_and_hang_of_a_batch_gang_through_the_store(batch_env, tmp_path):  # noqa: F811
    flow = tmp_path / "stuck.py"
    flow.write_text(STUCK)
    env = {**os.environ, **batch_env}
    proc = subprocess.Popen([sys.executable, "-u", str(flow), "run"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    seen, deadline = "", time.monotonic() + 150
    while seen.count("working") < 2 and time.monotonic() < deadline:
        seen += proc.stdout.readline()
    assert seen.count("working") >= 2, seen
    run_id = _run_id(seen)

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "stoker.cli.main", *args], env=env, capture_output=True,
                              text=True, timeout=90)

    try:
        p = cli("stacks", f"Stuck/{run_id}/work")
        assert p.returncode == 0, p.stdout + p.stderr
        assert p.stdout.count("in stuck_in_user_code") == 2, p.stdout  # both nodes answered through S3
        out, _ = proc.communicate(timeout=HANG_S + 90)
    finally:
        if proc.poll() is None:
            cli("kill", f"Stuck/{run_id}")
            proc.communicate(timeout=90)
    assert proc.returncode == 1 and "cause: hang (no progress)" in out, seen + out
    stacks = cli("logs", f"Stuck/{run_id}/work", "--stacks").stdout
    assert "stuck_in_user_code" in stacks and "threading.Event().wait()" in stacks, stacks
