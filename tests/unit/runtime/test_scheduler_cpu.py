"""The scheduler's own CPU per task (issue 13: a 10,000-way foreach of trivial tasks must spend < 10% of its wall
time in the scheduler). What each test pins is one of the per-task costs cut; benchmarks/README.md has the numbers.

The runs are real: the local backend forks real members from this process, with a real store and index.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import sys

import pytest

from stoker.backends.local.backend import LocalBackend
from stoker.errors import StoreError
from stoker.runtime.driver import scheduler as scheduler_mod
from stoker.runtime.driver.launch import start_run
from stoker.runtime.driver.output import TaskOutput
from stoker.store import signing
from stoker.store.blobs import open_store
from stoker.store.metadata import MetadataDB
from tests.helpers import FLOWS

N = 24


def _flow_class(path, name):
    spec = importlib.util.spec_from_file_location(f"flowmod_{name}_cpu", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return getattr(mod, name)


@pytest.fixture(scope="module")
def wide_run(tmp_path_factory):
    """One real 24-way foreach (4 workers), with every index write batch and the scheduler itself recorded."""
    home = tmp_path_factory.mktemp("home")
    mp = pytest.MonkeyPatch()
    mp.setenv("STOKER_HOME", str(home))
    mp.chdir(home)
    batches: list[list] = []
    plain_write = MetadataDB.write_batch
    mp.setattr(MetadataDB, "write_batch", lambda self, ops: (batches.append(list(ops)), plain_write(self, ops))[1])
    reads: list[str] = []  # manifests the scheduler read back from the store
    plain_outcome = scheduler_mod.manifest_outcome
    mp.setattr(scheduler_mod, "manifest_outcome", lambda store, name: (reads.append(name),
                                                                         plain_outcome(store, name))[1])
    seen = []
    plain_run = scheduler_mod.Scheduler.run
    mp.setattr(scheduler_mod.Scheduler, "run", lambda self: (seen.append(self), plain_run(self))[1])
    path = FLOWS / "wide_foreach_flow.py"
    backend = LocalBackend(str(path), mode="fork")
    try:
        result = start_run(_flow_class(path, "WideForeachFlow"), lambda step: backend, params={"n": str(N)},
                           quiet=True, max_workers=4)
    finally:
        mp.undo()
    assert result.status == "succeeded", result.failures
    return {"home": home, "run_id": result.run_id, "batches": batches, "sched": seen[0], "reads": reads}


def test_members_hand_their_manifests_over_and_the_index_keeps_the_bytes_stored(wide_run):
    """Each member sends the manifest it stored to the scheduler on a socket only the run holds: the scheduler
    reads none back from the store nor checks its signature (a fifth of its CPU per task), and the index keeps
    the very text stored."""
    assert wide_run["reads"] == [], "the scheduler read manifests back from the store"
    db = MetadataDB(wide_run["home"] / "metadata.db")
    store = open_store(str(wide_run["home"] / "store"))
    (text,) = db._query("SELECT manifest FROM attempts WHERE flow=? AND run_id=? AND step='square' AND task_id=?",
                        ("WideForeachFlow", wide_run["run_id"], db.list_tasks("WideForeachFlow", wide_run["run_id"],
                                                                               "square")[0].task_id))[0]
    name = f"runs/WideForeachFlow/{wide_run['run_id']}/square/{json.loads(text)['task_id']}/0/manifest.json"
    assert text.encode() == store.read(name)


def test_a_handed_manifest_of_another_attempt_another_key_or_too_large_for_a_packet_is_not_used(monkeypatch):
    """What is not used is read from the store and checked there (UntrustedManifest for another key)."""
    from stoker.runtime.member import handover
    from stoker.store.manifest import handed_manifest

    url = "/nowhere/store"
    monkeypatch.setenv(signing.KEY_ENV, "the-run-s-key")
    data = json.dumps({"flow": "F", "run_id": "1", "step": "s", "task_id": "2", "attempt": 0}).encode()
    sealed = signing.seal(url, data)
    assert handed_manifest(sealed, url, "F", "1", "s", "2", 0) == json.loads(data)
    assert handed_manifest(sealed, url, "F", "1", "s", "2", 1) is None, "another attempt's"
    assert handed_manifest(signing.seal(url, b"{torn"), url, "F", "1", "s", "2", 0) is None
    assert handed_manifest(sealed[:-1], url, "F", "1", "s", "2", 0) is None, "cut short"
    monkeypatch.setenv(signing.KEY_ENV, "a-task-s-other-key")
    assert handed_manifest(sealed, url, "F", "1", "s", "2", 0) is None, "sealed with another key"
    read, fd = handover.channel()
    try:
        handover.offer(fd)
        handover.claim()
        got: dict[int, bytes] = {}
        assert not handover.hand_over(b"x" * (handover.MAX_PACKET + 1))
        assert handover.hand_over(b"small")
        handover.receive(read, got)
        assert got == {os.getpid(): b"small"}
    finally:
        handover._mine[0] = -1
        read.close()
        os.close(fd)


def test_index_writes_of_a_pass_are_one_transaction(wide_run):
    """Registrations of the tasks one pass starts (4 at once here) share a transaction; every attempt is indexed."""
    regs = [sum(kind == "register" for kind, _ in b) for b in wide_run["batches"]]
    assert max(regs) >= 4, f"each registration was its own transaction: {regs}"
    assert len(wide_run["batches"]) < 2 * (N + 3), "one transaction per registration and per manifest"
    db = MetadataDB(wide_run["home"] / "metadata.db")
    tasks = db.list_tasks("WideForeachFlow", wide_run["run_id"], "square")
    assert len(tasks) == N and {t.status for t in tasks} == {"ok"}


def test_a_batch_is_all_or_nothing(tmp_path):
    db = MetadataDB(tmp_path / "db.sqlite")
    ok = ("register", dict(flow="F", run_id="1", step="s", task_id="1", attempt=0, user="u"))
    with pytest.raises(StoreError, match="unknown index operation"):
        db.write_batch([ok, ("bogus", {})])
    assert db.list_tasks("F", "1") == [], "the registration before the failure was rolled back"
    db.write_batch([ok])
    assert [t.status for t in db.list_tasks("F", "1")] == ["running"]


def test_silent_tasks_get_no_log_folder_or_empty_log_objects(wide_run, monkeypatch):
    """Most members of a wide foreach print nothing: no folder, no files, no empty store objects for them; a
    task that prints still gets its live log file and its log object, and a silent one reads as empty."""
    from stoker import Flow

    monkeypatch.setenv("STOKER_HOME", str(wide_run["home"]))
    logs = wide_run["home"] / "logs" / "WideForeachFlow" / wide_run["run_id"]
    assert not (logs / "square").exists()
    assert (logs / "end").is_dir()
    run = Flow("WideForeachFlow")[wide_run["run_id"]]
    assert "wide foreach ok" in run["end"].task.stdout
    assert all(t.stdout == "" and t.stderr == "" for t in run["square"])
    store = open_store(str(wide_run["home"] / "store"))
    assert not [n for n in store.list(f"runs/WideForeachFlow/{wide_run['run_id']}/square/") if n.endswith(".log")]


def test_lazy_task_output_creates_its_files_with_the_first_output(tmp_path):
    out = TaskOutput(tmp_path / "t.0", "p", lazy=True)
    assert not (tmp_path / "t.0").exists() and out.read("stdout") == b""
    assert out.feed("stderr", b"x\ny") == ["x"]
    out.close()
    assert (tmp_path / "t.0" / "stderr.log").read_bytes() == b"x\ny" and out.read("stdout") == b""


def test_finished_tasks_keep_neither_their_manifest_nor_their_log_buffers(wide_run):
    """The fork of each member costs time in proportion to the scheduler's memory, which every finished task's
    parsed manifest (~8 KB) and log buffers used to grow; their successors exist, the store keeps the rest."""
    done = [t for t in wide_run["sched"].tasks if t.step == "square"]
    assert len(done) == N
    assert all(t.manifest == {"status": "ok"} and t.output is None and t.job is None for t in done)


def test_the_heap_at_the_first_fork_is_frozen(wide_run):
    """gc.freeze(): the collector never walks (and so never writes to) the objects that existed at the first
    fork, so their pages stay shared with the members instead of being copied after each fork."""
    assert gc.get_freeze_count() > 0


def test_the_signing_key_path_is_worked_out_once(tmp_path, monkeypatch):
    monkeypatch.delenv(signing.KEY_ENV, raising=False)
    monkeypatch.delenv(signing.SECRET_ENV, raising=False)
    monkeypatch.setenv(signing.KEY_DIR_ENV, str(tmp_path / "keys"))
    url = str(tmp_path / "store")
    key = signing.store_key(url, create=True)

    def no_path(url):
        raise AssertionError("key_path() worked out again")

    monkeypatch.setattr(signing, "key_path", no_path)
    assert signing.store_key(url) == key
    monkeypatch.setenv(signing.KEY_DIR_ENV, str(tmp_path / "other"))  # another key folder: looked up again
    with pytest.raises(AssertionError, match="again"):
        signing.store_key(url)


def test_the_reaper_is_told_the_pids_of_a_pass_in_one_write():
    from stoker._process import Reaper

    r = Reaper(1.0)
    said: list[str] = []
    plain = r._say
    r._say = lambda line: (said.append(line), plain(line))[1]  # type: ignore[method-assign]
    try:
        r.watch(999_999_991)
        r.watch(999_999_992)
        assert said == []
        r.flush()
        assert said == ["999999991\n999999992\n"]
    finally:
        r.done()
    assert r.returncode == 0


def test_draining_an_exited_member_leaves_a_newer_members_pipes_alone():
    """A member that closes its output early frees its pipe numbers; the next member's pipes get them. Draining
    the first when it exits must not read or close the second's pipes (that lost its output, killed it with
    SIGPIPE, or crashed the run: "KeyError: 29 is not registered", seen once in a 3,000-way foreach)."""
    import os
    import time

    from stoker.runtime.contract import EXITED, Request, Unit
    from stoker.runtime.spec import TaskSpec

    def entry(spec: TaskSpec) -> int:
        if spec.task_id == "early":  # closes its output, then lives on a little
            os.close(1)
            os.close(2)
            time.sleep(1.0)
        else:
            time.sleep(1.5)
            print("late output", flush=True)
        return 0

    backend = LocalBackend("", mode="fork")
    backend.bind(entry)
    got: dict[str, bytes] = {}

    def sink(ref, member, stream, data):
        got[ref.job_id] = got.get(ref.job_id, b"") + data

    def submit(task_id: str):
        unit = Unit(kind="task", flow="F", run_id="1", step="s",
                    specs=[TaskSpec(flow="F", run_id="1", step="s", task_id=task_id)])
        return backend.submit(Request("local", unit, ""))

    try:
        early = submit("early")
        fds = backend.jobs[early.job_id].members[0].fds
        deadline = time.time() + 10
        while any(fd in backend.sel.get_map() for fd in fds) and time.time() < deadline:
            backend.wait(0.1, sink)  # reads the early member's EOFs and closes its pipes
        late = submit("late")
        assert set(fds) & set(backend.jobs[late.job_id].members[0].fds), "the new pipes did not reuse the numbers"
        states: dict[str, int] = {}
        while len(states) < 2 and time.time() < deadline:
            backend.wait(0.1, sink)
            for ref in (early, late):
                s = backend.poll([ref]).get(ref.job_id)
                if s is not None and s.state == EXITED:
                    states[ref.job_id] = s.exit_code
        assert states == {early.job_id: 0, late.job_id: 0}
        assert got.get(late.job_id) == b"late output\n"
    finally:
        backend.close()
