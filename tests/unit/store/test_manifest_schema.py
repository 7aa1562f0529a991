"""Manifest: one schema and one builder for task-attempt manifests, storing exactly the JSON stoker stored before."""

from __future__ import annotations

import json
import socket

import pytest

from stoker.errors import StoreError
from stoker.store.manifest import (
    Manifest,
    clone_manifest,
    exception_record,
    manifest_name,
    read_manifest,
    store_manifest,
    validate_manifest,
)
from stoker.store.signing import SIGNATURE, sign

# a gang node's manifest the scheduler wrote when its process was killed, as stoker stored it before Manifest
# existed (a real one; its signature is dropped: each test's store has its own key)
STORED_TASK_DIED = (
    '{"artifacts": {}, "attempt": 0, "catch_var": null, "exception": {"message": "task process killed by signal '
    'SIGKILL", "traceback": "", "type": "TaskDied"}, "finished_at": 1796555996.0085285, "flow": "GangFlow", '
    '"foreach_stack": [{"desc": null, "index": 1, "num_splits": 2, "step": "start", "var": null}], "hostname": "vm", '
    '"input_paths": ["GangFlow/1796555995242272/start/1"], "iteration": [], "logs": {"stderr": '
    '"runs/GangFlow/1796555995242272/work/3/0/stderr.log", "stdout": "runs/GangFlow/1796555995242272/work/3/0/'
    'stdout.log"}, "origin_task": null, "parallel": {"node_index": 1, "num_nodes": 2}, "retry_count": 0, "run_id": '
    '"1796555995242272", "started_at": 1796555995.3041167, "status": "failed", "step": "work", "task_id": "3", '
    '"user": "root"}')

# a task's own manifest after @catch handled its failure, in the same format (artifact descriptors shortened)
STORED_CAUGHT = {
    "artifacts": {"x": {"blobs": [], "inline": "gAVLAS4=", "kind": "pickle", "owner": "root", "owner_run": "F/5",
                        "repr": "1", "sha": "ab" * 32, "size": 5, "type": "int"}},
    "attempt": 2, "catch_var": "err", "exception": None, "finished_at": 12.5, "flow": "F",
    "foreach_stack": [{"desc": {"kind": "pickle", "sha": "cd" * 32}, "index": 0, "num_splits": 3, "step": "start",
                       "var": "items"}],
    "hostname": "vm", "input_paths": ["F/5/start/1"], "iteration": [0],
    "logs": {"stderr": "runs/F/5/safe/3/2/stderr.log", "stdout": "runs/F/5/safe/3/2/stdout.log"},
    "next": {"steps": ["join"]}, "origin_task": None, "parallel": None, "retry_count": 2, "run_id": "5",
    "started_at": 11.0, "status": "ok", "step": "safe", "task_id": "3", "user": "root",
}


def _stored_bytes(store, doc: dict) -> tuple[str, bytes]:
    """What the earlier stoker wrote for ``doc`` in ``store``: its signed JSON."""
    name = manifest_name(doc["flow"], doc["run_id"], doc["step"], doc["task_id"], doc["attempt"])
    return name, json.dumps(sign(store.url, name, doc), sort_keys=True).encode()


def _gang_node_head(**over) -> Manifest:
    args = dict(flow="GangFlow", run_id="1796555995242272", step="work", task_id="3", attempt=0,
                started_at=1796555995.3041167, user="root", input_paths=["GangFlow/1796555995242272/start/1"],
                foreach=[{"step": "start", "var": None, "index": 1, "num_splits": 2, "desc": None}], iteration=[],
                parallel={"main_ip": "127.0.0.1", "num_nodes": 2, "node_index": 1, "port": 29500,
                          "control_task_id": "2"})
    return Manifest.begin(**{**args, **over})


def test_the_schedulers_manifest_of_a_dead_task_is_stored_byte_for_byte_as_before(store, monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "vm")
    m = _gang_node_head().failed("TaskDied", "task process killed by signal SIGKILL", finished_at=1796555996.0085285)
    assert m.to_dict() == json.loads(STORED_TASK_DIED)
    name, before = _stored_bytes(store, json.loads(STORED_TASK_DIED))
    assert store_manifest(store, m) == (name, before)
    assert m.signature == json.loads(before)[SIGNATURE], "the written manifest carries its signature"


def test_a_tasks_own_manifest_as_it_was_built_before(monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "vm")
    m = Manifest.begin(flow="F", run_id="5", step="safe", task_id="3", attempt=2, started_at=11.0, user="root",
                       input_paths=["F/5/start/1"], iteration=[0], parallel=None,
                       foreach=[{"step": "start", "var": "items", "index": 0, "num_splits": 3,
                                 "desc": {"kind": "pickle", "sha": "cd" * 32}}])
    m["catch_var"] = "err"  # what @catch's hook does with ctx.manifest
    m["next"] = {"steps": ["join"]}
    m.finish("ok", dict(STORED_CAUGHT["artifacts"]))
    d = m.to_dict()
    assert d.pop("finished_at") >= 11.0
    assert d == {k: v for k, v in STORED_CAUGHT.items() if k != "finished_at"}


@pytest.mark.parametrize("stored", [json.loads(STORED_TASK_DIED), STORED_CAUGHT], ids=["task-died", "caught"])
def test_a_stored_manifest_of_the_current_format_reads_round_trips_and_stores_the_same_bytes(store, stored):
    name, before = _stored_bytes(store, stored)
    store.write(name, before)
    read = read_manifest(store, stored["flow"], stored["run_id"], stored["step"], stored["task_id"],
                         stored["attempt"])  # its signature verified
    m = Manifest.from_dict(read)
    assert m.to_dict() == read and Manifest.from_dict(m.to_dict()) == m
    assert validate_manifest(read) == read
    assert store_manifest(store, m) == (name, before)


def test_a_manifest_from_an_older_or_newer_stoker_keeps_what_it_has():
    """No iteration, no retry_count (older), a key this version does not know (newer): nothing is added but the
    defaults validate_manifest always filled in, and the unknown key is kept."""
    old = {"flow": "F", "run_id": "1", "step": "s", "task_id": "1", "attempt": 1, "status": "ok", "started_at": 1,
           "finished_at": 2.0, "artifacts": {}, "someday": {"a": 1}}
    m = Manifest.from_dict(old)
    assert m.retry_count == 1 and m.iteration is None and m.extra == {"someday": {"a": 1}}
    assert m.to_dict() == {**old, "exception": None, "logs": {}, "input_paths": [], "foreach_stack": [],
                           "parallel": None, "user": None, "hostname": None, "origin_task": None, "retry_count": 1,
                           "catch_var": None}
    assert Manifest.from_dict(m.to_dict()) == m


def test_clone_failed_and_with_reason_change_only_what_they_say():
    died = Manifest.from_dict(json.loads(STORED_TASK_DIED))
    ok = Manifest.from_dict(STORED_CAUGHT)
    clone = clone_manifest(ok.to_dict(), run_id="9", task_id="4", user="bob", input_paths=["F/9/start/1"])
    assert clone == {**STORED_CAUGHT, "run_id": "9", "task_id": "4", "attempt": 0, "retry_count": 0, "user": "bob",
                     "origin_task": "F/5/safe/3", "input_paths": ["F/9/start/1"]}
    assert clone_manifest(clone, run_id="10")["origin_task"] == "F/5/safe/3", "a clone's clone points at the origin"
    exit_code = ok.failed("ExitCode", "exit code 1")
    assert exit_code.to_dict() == {**STORED_CAUGHT, "status": "failed",
                                   "exception": {"type": "ExitCode", "message": "exit code 1", "traceback": ""}}
    assert ok.status == "ok", "failed() is a copy"
    oom = died.with_reason("slurm: out of memory").exception
    assert oom == {"type": "TaskDied", "message": "task process killed by signal SIGKILL (slurm: out of memory)",
                   "traceback": ""}
    preempted = exception_record("Preempted", "stopped", "tb", preempted=True, resume_step=3)
    assert preempted == {"type": "Preempted", "message": "stopped", "traceback": "tb", "preempted": True,
                         "resume_step": 3}


def test_a_hook_reads_and_sets_keys_as_a_dicts():
    m = Manifest.from_dict({k: v for k, v in STORED_CAUGHT.items() if k != "next"})
    assert "next" not in m and m.get("next") is None and "exception" in m and m.get("exception", 1) is None
    with pytest.raises(KeyError):
        m["next"]
    m["next"] = {"steps": ["end"]}
    m["note"] = "from a hook"
    assert m.next == {"steps": ["end"]} and m["note"] == "from a hook"
    assert m.to_dict()["note"] == "from a hook" and m.to_dict()["next"] == {"steps": ["end"]}


@pytest.mark.parametrize("change,msg", [
    ({"status": "done"}, "status must be one of"),
    ({"attempt": True}, "'attempt' must be"),
    ({"task_id": ""}, "must be non-empty"),
])
def test_a_manifest_is_checked_when_built_and_when_stored(store, change, msg):
    with pytest.raises(StoreError, match=msg):
        Manifest.from_dict({**STORED_CAUGHT, **change})
    m = Manifest.from_dict(STORED_CAUGHT)
    for k, v in change.items():
        m[k] = v  # a hook may change it after it was built
    with pytest.raises(StoreError, match=msg):
        store_manifest(store, m)
    with pytest.raises(StoreError, match="lacks the field 'artifacts'"):
        Manifest.from_dict({k: v for k, v in STORED_CAUGHT.items() if k != "artifacts"})
