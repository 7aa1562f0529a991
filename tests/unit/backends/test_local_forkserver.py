"""The local backend's fork server (STOKER_TASK_LAUNCH=forkserver): members are forked by one small server
process, not by the scheduler, whose page tables and copy-on-write faults grew with the run (issue 13). Real
processes, real signals; no mocks."""

from __future__ import annotations

import os
import signal
import sys
import time

import psutil
import pytest

from stoker.backends.local import forkserver
from stoker.backends.local.backend import LocalBackend
from stoker.runtime.contract import EXITED, Request, Unit
from stoker.runtime.spec import TaskSpec

pytestmark = pytest.mark.skipif(not forkserver.available(), reason="needs fork and SCM_RIGHTS")


def _entry(spec: TaskSpec) -> int:
    kind = spec.task_id.split("-")[0]
    if kind == "ok":
        print(f"ppid {os.getppid()} env {os.environ.get('H10_LATE', '-')} member {os.environ['STOKER_MEMBER']}")
        print("to stderr", file=sys.stderr)
        return 0
    if kind == "code":
        return 3
    if kind == "pre":
        print(f"preloaded by {getattr(sys, '_stoker_test_preloaded', None)} ppid {os.getppid()}")
        return 0
    if kind == "nested":  # offers a channel to members of its own (a local run inside a task), then hands over
        from stoker.runtime.member import handover

        _, fd = handover.channel()
        handover.offer(fd)
        return 0 if handover.hand_over(b"mine") else 4
    time.sleep(60)  # "sleep": cancelled by the test
    return 0


def _submit(backend: LocalBackend, task_id: str, size: int = 1):
    specs = [TaskSpec(flow="F", run_id="1", step="s", task_id=f"{task_id}-{i}") for i in range(size)]
    unit = Unit(kind="gang" if size > 1 else "task", flow="F", run_id="1", step="s", specs=specs)
    return backend.submit(Request("local", unit, ""))


def _sink_into(out: dict):
    return lambda ref, m, stream, data: out.__setitem__((ref.job_id, m, stream),
                                                        out.get((ref.job_id, m, stream), b"") + data)


def _finish(backend: LocalBackend, refs, out: dict, timeout: float = 20.0, done: dict | None = None) -> dict:
    """Wait for `refs` to exit; `done`: what an earlier poll already reported (a job is reported exited once)."""
    done = dict(done or {})
    deadline = time.time() + timeout
    sink = _sink_into(out)
    while len(done) < len(refs) and time.time() < deadline:
        backend.wait(0.1, sink)
        for ref in refs:
            s = backend.poll([ref]).get(ref.job_id)
            if s is not None and s.state == EXITED:
                done[ref.job_id] = s
    assert len(done) == len(refs), "members did not finish"
    return done


def test_members_are_the_servers_children_with_output_exit_codes_and_the_current_environment(monkeypatch):
    backend = LocalBackend("", mode="forkserver")
    backend.bind(_entry)
    out: dict = {}
    try:
        assert backend.mode == "forkserver"
        first = _submit(backend, "ok")
        assert backend.server is None, "a submission is forked at the next wait/poll, with the pass's others"
        backend.wait(0.0, _sink_into(out))  # forks it (its output goes to `out`)
        early = {k: v for k, v in backend.poll([first]).items() if v.state == EXITED}  # a fast member may be done
        server = backend.server
        assert server is not None and server.pid != os.getpid()
        monkeypatch.setenv("H10_LATE", "set-after-the-server-started")
        refs = [_submit(backend, "ok", size=2), _submit(backend, "code")]
        done = _finish(backend, [first, *refs], out, done=early)
        assert done[refs[1].job_id].exit_code == 3, "the exit code comes from the server's report"
        assert done[first.job_id].exit_code == 0 and done[refs[0].job_id].exit_code == 0
        line = out[(refs[0].job_id, 1, "stdout")].decode()
        # the scheduler forked no member: their parent is the server, so its page tables were never copied
        assert line == f"ppid {server.pid} env set-after-the-server-started member 1\n"
        assert out[(first.job_id, 0, "stderr")] == b"to stderr\n"
        assert backend.server is server, "one server for the whole run"
    finally:
        cpu_before = forkserver.SERVER_CPU[0]
        backend.close()
    assert forkserver.SERVER_CPU[0] > cpu_before, "the server reports its CPU time when closed"
    # close() does not wait for the server's exit once it has reported: a daemon thread reaps it (no zombie left)
    deadline = time.time() + 5
    while psutil.pid_exists(server.pid) and time.time() < deadline:
        time.sleep(0.01)
    assert not psutil.pid_exists(server.pid), "reaped, not a zombie"


def _preload() -> None:
    sys._stoker_test_preloaded = os.getpid()  # type: ignore[attr-defined]


def _broken_preload() -> None:
    raise ImportError("no such module")


@pytest.mark.parametrize("preload", [_preload, _broken_preload])
def test_the_preload_runs_once_in_the_server_and_a_failing_one_is_only_skipped(preload):
    """What every task imports is imported by the server, before it forks: members inherit it (a trivial task
    spent 10-30 ms importing it on its own). A preload that fails costs nothing but the speed-up."""
    backend = LocalBackend("", mode="forkserver")
    backend.bind(_entry, preload)
    out: dict = {}
    try:
        refs = [_submit(backend, "pre"), _submit(backend, "pre")]
        done = _finish(backend, refs, out)
        server = backend.server.pid
        assert all(s.exit_code == 0 for s in done.values())
        who = server if preload is _preload else None
        for ref in refs:
            assert out[(ref.job_id, 0, "stdout")].decode() == f"preloaded by {who} ppid {server}\n"
        assert not hasattr(sys, "_stoker_test_preloaded"), "the scheduler itself imports nothing more"
    finally:
        backend.close()


def test_cancel_reaches_a_servers_member_and_its_signal_is_the_exit_status():
    backend = LocalBackend("", mode="forkserver")
    backend.bind(_entry)
    try:
        ref = _submit(backend, "sleep")
        time.sleep(0.3)
        backend.cancel(ref, grace=0)
        done = _finish(backend, [ref], {})
        assert done[ref.job_id].exit_code == -signal.SIGKILL
    finally:
        backend.close()


def test_a_dead_server_fails_its_members_and_the_next_start_names_the_fix():
    backend = LocalBackend("", mode="forkserver")
    backend.bind(_entry)
    try:
        ref = _submit(backend, "sleep")
        backend.poll([ref])  # forked now
        member_pid = backend.jobs[ref.job_id].members[0].pid
        os.kill(backend.server.pid, signal.SIGKILL)  # type: ignore[union-attr]
        done = _finish(backend, [ref], {})  # no busy loop, no hang: the member is reported failed
        assert done[ref.job_id].exit_code != 0
        with pytest.raises(forkserver.ForkServerDied, match="STOKER_TASK_LAUNCH=fork"):
            backend.poll([_submit(backend, "ok")])
    finally:
        backend.close()
        try:
            os.kill(member_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_pass_forks_its_members_in_one_request_and_each_hands_over_on_its_own_socket(monkeypatch):
    """The members one scheduler pass submits go to the server in one request (a round trip per member was a
    sixth of the scheduler's CPU in a 10,000-way foreach). A member that offers a socket to members of its own
    (a local run inside a task) still hands its manifest to its own scheduler."""
    requests: list[int] = []
    plain = forkserver.ForkServer._request
    monkeypatch.setattr(forkserver.ForkServer, "_request",
                        lambda self, members: (requests.append(len(members)), plain(self, members))[1])
    backend = LocalBackend("", mode="forkserver")
    backend.bind(_entry)
    try:
        refs = [_submit(backend, "nested") for _ in range(5)]
        backend.dispatch()
        assert requests == [5]
        done = _finish(backend, refs, {})
        assert {s.exit_code for s in done.values()} == {0}
        assert [backend.handed(r, 0) for r in refs] == [b"mine"] * 5
    finally:
        backend.close()
