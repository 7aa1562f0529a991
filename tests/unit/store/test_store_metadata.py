"""The SQLite metadata index: schema, run lifecycle, manifest ingest (idempotent), tags, queries."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from stoker.errors import StoreError
from stoker.store import MetadataDB
from stoker.store.manifest import (
    clone_manifest,
    latest_manifest,
    read_manifest,
    validate_manifest,
    write_run_record,
)
from stoker.store.metadata import SCHEMA_VERSION


def test_schema_wal_and_version(db):
    db.create_run("F", "1", user="u", params={})
    with MetadataDB(db.path) as again:  # reopening keeps the data
        assert again.get_run("F", "1").user == "u"
    conn = sqlite3.connect(db.path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"flows", "runs", "steps", "tasks", "attempts", "artifacts", "tags", "schema_version"} <= tables
    assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
    conn.execute("UPDATE schema_version SET version=99")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="newer than this stoker"):
        MetadataDB(db.path)


def test_run_lifecycle_and_tags(db):
    run = db.create_run("Train", "1", user="alice", tags=["exp:a"], params={"lr": 0.1}, config={"m": 1},
                        created_at=100.0)
    assert run.status == "running" and run.params == {"lr": 0.1} and run.config == {"m": 1}
    assert run.system_tags == ("user:alice",) and run.user_tags == ("exp:a",)
    assert run.tags == ("exp:a", "user:alice")
    with pytest.raises(StoreError, match="already exists"):
        db.create_run("Train", "1", user="alice", params={})
    db.set_run_status("Train", "1", "succeeded")
    rec = db.get_run("Train", "1")
    assert rec.status == "succeeded" and rec.finished_at is not None
    with pytest.raises(StoreError, match="not one of"):
        db.set_run_status("Train", "1", "done")
    with pytest.raises(StoreError, match="create_run it first"):
        db.set_run_status("Train", "404", "failed")
    db.add_tags("Train", "1", ["keep", "exp:b"])
    db.remove_tags("Train", "1", ["exp:a", "absent"])
    assert db.get_run("Train", "1").user_tags == ("exp:b", "keep")
    with pytest.raises(StoreError, match="system tag"):
        db.remove_tags("Train", "1", ["user:alice"])
    with pytest.raises(StoreError, match="invalid tag"):
        db.add_tags("Train", "1", [""])
    with pytest.raises(StoreError, match="does not exist"):
        db.add_tags("Train", "2", ["x"])


def test_list_and_latest_runs(db):
    db.create_run("F", "1", user="alice", params={}, created_at=1.0)
    db.create_run("F", "2", user="bob", tags=["t"], params={}, created_at=2.0)
    db.create_run("F", "3", user="alice", tags=["t"], params={}, created_at=3.0)
    db.create_run("G", "1", user="alice", params={}, created_at=4.0)
    db.set_run_status("F", "1", "succeeded")
    db.set_run_status("F", "3", "failed")
    assert [r.run_id for r in db.list_runs("F")] == ["3", "2", "1"]
    assert [r.run_id for r in db.list_runs("F", tags=["t"])] == ["3", "2"]
    assert [r.run_id for r in db.list_runs("F", tags=["t", "user:alice"])] == ["3"]
    assert [r.pathspec for r in db.list_runs(limit=2)] == ["G/1", "F/3"]
    assert db.latest_run("F").run_id == "3"
    assert db.latest_run("F", status="succeeded").run_id == "1"
    assert db.latest_run("F", tags=["nope"]) is None
    assert db.list_flows() == ["F", "G"] and db.has_flow("G") and not db.has_flow("H")


def test_ingest_is_idempotent_and_indexes_everything(maker, db, store):
    maker.run("F", "1", status="running")
    m = maker.task("F", "1", "start", "1", data={"x": 1, "name": "a"}, stdout="hi\n")
    maker.task("F", "1", "each", "2", data={"y": 0}, foreach_stack=[
        {"step": "start", "var": "items", "index": 0, "num_splits": 2, "value_repr": "'a'"}])
    maker.task("F", "1", "each", "3", data={"y": 1}, foreach_stack=[
        {"step": "start", "var": "items", "index": 1, "num_splits": 2, "value_repr": "'b'"}])

    def snapshot():
        conn = sqlite3.connect(db.path)
        out = {t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall(), key=repr)
               for t in ("flows", "runs", "steps", "tasks", "attempts", "artifacts", "tags")}
        conn.close()
        return out

    before = snapshot()
    db.ingest_manifest(m)
    db.ingest_manifest(read_manifest(store, "F", "1", "start", "1", 0))
    assert snapshot() == before
    assert [s.step for s in db.list_steps("F", "1")] == ["start", "each"]
    each = db.get_step("F", "1", "each")
    assert each.num_tasks == 2 and each.num_ok == 2
    tasks = db.list_tasks("F", "1", "each")
    assert [(t.task_id, t.foreach_index) for t in tasks] == [("2", (0,)), ("3", (1,))]
    arts = db.list_artifacts("F", "1", "start", "1")
    assert [a.name for a in arts] == ["name", "x"] and arts[1].descriptor == m["artifacts"]["x"]
    assert db.get_artifact("F", "1", "start", "1", "x").sha == m["artifacts"]["x"]["sha"]
    assert db.get_artifact("F", "1", "start", "1", "zz") is None
    att = db.get_attempt("F", "1", "start", "1")
    assert att.manifest["logs"]["stdout"].endswith("0/stdout.log") and att.hostname == "testhost"


def test_attempts_retries_and_out_of_order_ingest(maker, db):
    maker.run("F", "1", status="running")
    db.register_attempt("F", "1", "train", "5", 0, started_at=maker.tick(), user="alice")
    t = db.get_task("F", "1", "train", "5")
    assert (t.attempt, t.status) == (0, "running")
    assert db.get_step("F", "1", "train").num_running == 1
    second = maker.task("F", "1", "train", "5", attempt=1, data={"loss": 0.5}, ingest=False)
    first = maker.task("F", "1", "train", "5", attempt=0, status="failed", data={},
                       exception={"type": "ValueError", "message": "boom", "traceback": "..."}, ingest=False)
    db.ingest_manifest(second)  # the retry's manifest arrives first
    db.ingest_manifest(first)
    db.register_attempt("F", "1", "train", "5", 0)  # late registration changes nothing
    t = db.get_task("F", "1", "train", "5")
    assert (t.attempt, t.status) == (1, "ok")
    assert [(a.attempt, a.status) for a in db.list_attempts("F", "1", "train", "5")] == [(0, "failed"), (1, "ok")]
    assert db.get_attempt("F", "1", "train", "5", 0).manifest["exception"]["message"] == "boom"
    assert [a.name for a in db.list_artifacts("F", "1", "train", "5")] == ["loss"]
    assert db.list_artifacts("F", "1", "train", "5", attempt=0) == []


def test_manifest_of_unknown_run_creates_it(db, maker):
    maker.task("Lone", "7", "start", "1", data={"a": 1}, user="carol")
    run = db.get_run("Lone", "7")
    assert run.status == "running" and run.user == "carol" and "user:carol" in run.system_tags


def test_rebuild_index_from_store(maker, store, tmp_path):
    maker.run("F", "1")
    maker.task("F", "1", "start", "1", data={"a": 1})
    maker.task("F", "1", "end", "2", data={"b": 2})
    write_run_record(store, {"flow": "F", "run_id": "1", "user": "alice", "tags": ["exp"], "params": {"n": 2},
                             "created_at": 5.0, "status": "succeeded", "finished_at": 9.0})
    fresh = MetadataDB(tmp_path / "rebuilt.db")
    assert fresh.ingest_run_from_store(store, "F", "1") == 2
    assert [t.step for t in fresh.list_tasks("F", "1")] == ["start", "end"]
    run = fresh.get_run("F", "1")
    assert (run.params, run.tags, run.status, run.finished_at) == ({"n": 2}, ("exp", "user:alice"), "succeeded", 9.0)
    assert fresh.ingest_run_from_store(store, "F", "1") == 2  # again: same index
    assert len(fresh.list_runs("F")) == 1 and len(fresh.list_tasks("F", "1")) == 2


def test_latest_manifest_from_the_store_alone(maker, store):
    maker.run("F", "1")
    for attempt in (0, 1, 2):
        maker.task("F", "1", "train", "3", attempt=attempt, data={"a": attempt}, ingest=False)
    assert latest_manifest(store, "F", "1", "train", "3")["attempt"] == 2
    with pytest.raises(StoreError, match="F/1/train/4 has no manifest"):
        latest_manifest(store, "F", "1", "train", "4")


def test_clone_manifest_for_resume(maker, db):
    maker.run("F", "1", status="failed")
    original = maker.task("F", "1", "start", "1", data={"a": 1}, attempt=1)
    db.create_run("F", "2", user="alice", params={}, origin_run_id="1")
    clone = clone_manifest(original, run_id="2")
    db.ingest_manifest(clone)
    assert clone["origin_task"] == "F/1/start/1" and clone["attempt"] == 0
    assert clone_manifest(clone, run_id="3")["origin_task"] == "F/1/start/1"  # points at the real origin
    assert db.get_artifact("F", "2", "start", "1", "a").sha == original["artifacts"]["a"]["sha"]
    assert db.get_run("F", "2").origin_run_id == "1"


@pytest.mark.parametrize("bad,msg", [
    ({}, "lacks the field 'flow'"),
    ({"attempt": "0"}, "'attempt' must be"),
    ({"status": "done"}, "status must be one of"),
    ({"step": "a/b"}, "contain no '/'"),
])
def test_invalid_manifests(db, bad, msg):
    good = {"flow": "F", "run_id": "1", "step": "s", "task_id": "1", "attempt": 0, "status": "ok",
            "started_at": 1.0, "finished_at": 2.0, "artifacts": {}}
    with pytest.raises(StoreError, match=msg):
        db.ingest_manifest({} if not bad else {**good, **bad})
    assert validate_manifest(good)["retry_count"] == 0


def test_reader_in_another_process_sees_committed_writes(db):
    db.create_run("F", "1", user="alice", params={"n": 3})
    code = ("import sys; from stoker.store import MetadataDB; d = MetadataDB(sys.argv[1]); "
            "print(d.get_run('F', '1').params['n'])")
    out = subprocess.run([sys.executable, "-c", code, str(db.path)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "3"


def test_manifest_with_partial_foreach_entry_and_extra_fields(db):
    """A scheduler-written failure manifest may lack foreach values and carry extra keys."""
    m = {"flow": "F", "run_id": "1", "step": "each", "task_id": "4", "attempt": 0, "status": "failed",
         "started_at": 1.0, "finished_at": 2.0, "artifacts": {}, "next": {"steps": ["join"]},
         "foreach_stack": [{"step": "start", "var": "items", "index": None, "num_splits": None}]}
    db.ingest_manifest(m)
    assert db.get_task("F", "1", "each", "4").foreach_index == (-1,)
    assert db.get_attempt("F", "1", "each", "4").manifest["next"] == {"steps": ["join"]}


def test_one_batch_of_many_tasks_indexes_like_single_writes(db):
    """The scheduler writes a pass's registrations in one transaction, making sure of a step's rows once per
    transaction: the step still gets the earliest time, each new task its row and foreach index, and a retry
    registered in the same batch becomes the task's latest attempt."""
    stack = lambda i: [{"step": "start", "index": i, "num_splits": 3, "var": "items"}]  # noqa: E731
    ops = [("register", dict(flow="B", run_id="1", step="sq", task_id=str(i), attempt=0, started_at=t,
                             user="alice", foreach_stack=stack(i)))
           for i, t in [(0, 20.0), (1, 10.0), (2, 30.0)]]
    ops.append(("register", dict(flow="B", run_id="1", step="sq", task_id="0", attempt=1, started_at=40.0,
                                 user="alice", foreach_stack=stack(0))))
    db.write_batch(ops)
    (created,) = db._query("SELECT created_at FROM steps WHERE flow='B' AND run_id='1' AND step='sq'")[0]
    assert created == 10.0
    rows = db._query("SELECT task_id, attempt, started_at, foreach_index FROM tasks WHERE flow='B' ORDER BY task_id")
    assert rows == [("0", 1, 20.0, "[0]"), ("1", 0, 10.0, "[1]"), ("2", 0, 30.0, "[2]")]
