"""A local `@retry` runs the next attempt at once, as Metaflow's local runtime does (issue 35): its
`minutes_between_retries` (default 2) is waited only before a remote attempt (Slurm, Batch)."""

from __future__ import annotations

import time

from stoker import Flow
from tests.helpers import run_flow

FLAKY = '''
from stoker import FlowSpec, current, retry, step

class LocalRetryFlow(FlowSpec):
    @retry(times=1)
    @step
    def start(self):
        if current.retry_count == 0:
            raise RuntimeError("the first attempt fails")
        self.next(self.end)

    @step
    def end(self):
        pass

if __name__ == "__main__":
    LocalRetryFlow()
'''


def test_a_local_retry_starts_at_once(tmp_path):
    flow = tmp_path / "local_retry.py"
    flow.write_text(FLAKY)
    t0 = time.time()
    p = run_flow(flow, "run", cwd=tmp_path, timeout=110)
    assert time.time() - t0 < 60, "the default 2 minutes between retries is not waited locally"
    assert "retry 1 of 1" in p.stdout + p.stderr and "retry 1 of 1 in" not in p.stdout + p.stderr
    start = Flow("LocalRetryFlow").latest_run["start"].task
    assert start.retry_count == 1 and [a.successful for a in start.attempts] == [False, True]
