"""`stoker kill` and the guardian give a job its grace ($STOKER_KILL_GRACE) before the hard cancel (issue 25: the
hard cancel came 17 ms after the gentle one). The backend here is a stand-in that records when it was asked what
(the ordering is what is tested; the real Slurm path is in tests/integration/test_slurm_*)."""

from __future__ import annotations

import time

import stoker.backends as backends
from stoker.cli.guardian import cancel_jobs
from stoker.runtime.contract import EXITED, RUNNING, JobRef, JobStatus


class Recorder:
    def __init__(self, stops_after: float | None) -> None:
        self.stops_after, self.asked, self.closed = stops_after, None, None

    def poll(self, refs):
        stopped = self.asked is not None and self.stops_after is not None \
            and time.monotonic() - self.asked >= self.stops_after
        return {r.job_id: JobStatus(EXITED if stopped else RUNNING) for r in refs}

    def cancel(self, ref, grace=3.0, member=None):
        self.asked = time.monotonic()

    def wait(self, timeout, sink):
        time.sleep(timeout)

    def close(self):
        self.closed = time.monotonic()


def _cancel(monkeypatch, backend, grace):
    monkeypatch.setattr(backends, "make_backend", lambda name, **kw: backend)
    return cancel_jobs([JobRef(backend="rec", job_id="7")], grace=grace)


def test_the_hard_cancel_waits_for_the_grace(monkeypatch):
    b = Recorder(stops_after=None)  # ignores TERM
    cancelled, failed = _cancel(monkeypatch, b, grace=1.5)
    assert [r.job_id for r in cancelled] == ["7"] and not failed
    assert b.closed - b.asked >= 1.4


def test_a_job_that_stops_in_its_grace_is_not_waited_for(monkeypatch):
    b = Recorder(stops_after=0.3)
    _cancel(monkeypatch, b, grace=30)
    assert 0.25 <= b.closed - b.asked < 5
