"""The parts of the client that follow Metaflow's API closely: lineage, metadata events, log lines, tags with
Metaflow's rules, TaskException's fields, and the get_metadata/metadata/default_metadata switches."""

from __future__ import annotations

import argparse
from datetime import datetime

import pytest

from stoker.client import Flow, Metadata, Run
from stoker.client import base as client_base
from stoker.client.base import TaskException, default_metadata, get_metadata, metadata
from stoker.errors import ConfigError, StoreError
from stoker.store.manifest import write_manifest
from stoker.store.paths import current_user
from stoker.store.records import check_tag


@pytest.fixture
def lineage(maker):
    """Lin/1: start -> a (foreach of 2) -> join -> end; input paths as the runtime records them."""
    maker.run("Lin", "1", tags=["t1"])
    _reingest(maker, maker.task("Lin", "1", "start", "1", data={"xs": [1, 2]}, stdout="one\ntwo\n", ingest=False), [])
    for i, tid in enumerate(["2", "3"]):
        m = maker.task("Lin", "1", "a", tid, data={"x": i}, ingest=False,
                       foreach_stack=[{"step": "start", "var": "xs", "index": i, "num_splits": 2}])
        _reingest(maker, m, ["Lin/1/start/1"])
    _reingest(maker, maker.task("Lin", "1", "join", "4", ingest=False), ["Lin/1/a/2", "Lin/1/a/3"])
    _reingest(maker, maker.task("Lin", "1", "end", "5", ingest=False), ["Lin/1/join/4"])
    return maker


def _reingest(maker, m, inputs):
    m["input_paths"] = inputs
    m["next"] = {"steps": {"start": ["a"], "a": ["join"], "join": ["end"]}.get(m["step"], [])}
    write_manifest(maker.store, m)
    maker.db.ingest_manifest(m)


def kw(maker):
    return {"db": maker.db, "store": maker.store}


def test_parent_and_child_tasks(lineage):
    run = Run("Lin/1", **kw(lineage))
    assert [t.pathspec for t in run["join"].task.parent_tasks] == ["Lin/1/a/2", "Lin/1/a/3"]
    assert [t.pathspec for t in run["start"].task.child_tasks] == ["Lin/1/a/2", "Lin/1/a/3"]
    assert [t.pathspec for t in run["a"]["2"].parent_tasks] == ["Lin/1/start/1"]
    assert list(run["start"].task.parent_tasks) == [] and list(run["end"].task.child_tasks) == []


def test_metadata_events_and_dict(lineage):
    task = Run("Lin/1", **kw(lineage))["a"]["3"]
    events = task.metadata
    assert all(isinstance(m, Metadata) and isinstance(m.created_at, int) and m.task is task for m in events)
    md = task.metadata_dict
    assert md["attempt"] == "0" and md["origin-run-id"] == "None" and md["user"] == "alice"
    assert md["attempt_ok"] == "True" and md["attempt-done"] == "0" and md["ds-type"] == "local"
    assert md["foreach-execution-path"] == "start:1"  # no run record here: the split step names the frame


def test_loglines_are_timestamped_tuples(lineage):
    task = Run("Lin/1", **kw(lineage))["start"].task
    lines = list(task.loglines("stdout"))
    assert [ln for _, ln in lines] == ["one", "two"] and all(isinstance(ts, datetime) for ts, _ in lines)
    assert list(task.loglines("stderr")) == [] and task.stdout_size == 8
    with pytest.raises(ValueError):
        list(task.loglines("nope"))


def test_tags_follow_metaflows_rules(lineage):
    run = Run("Lin/1", **kw(lineage))
    run.add_tag("a")
    run.add_tags(["b", "c"])
    run.replace_tag("a", "d")
    assert run.user_tags == {"t1", "b", "c", "d"}
    run.remove_tags(["b", "c", "not-there"])
    run.add_tag("user:alice")  # a system tag: not added, no error
    assert run.user_tags == {"t1", "d"} and "user:alice" in run.system_tags
    assert Run("Lin/1", **kw(lineage))["start"].task.tags == run.tags and Flow("Lin", **kw(lineage)).tags == set()
    with pytest.raises(StoreError, match="system tag"):
        run.remove_tag("user:alice")
    with pytest.raises(StoreError, match="at least one tag"):
        run.replace_tags([], [])
    with pytest.raises(StoreError, match="may not be a string"):
        run.remove_tags("abc")
    with pytest.raises(StoreError, match="beyond 50"):
        run.add_tags([f"t{i}" for i in range(60)])
    assert run.user_tags == {"t1", "d"}  # nothing changed by a refused mutation


def test_check_tag_limits():
    assert check_tag("x" * 500) == "x" * 500 and check_tag(b"bytes") == "bytes"
    for bad in ("", "x" * 501, 3, b"\xff"):
        with pytest.raises(StoreError):
            check_tag(bad)


def test_task_exception_fields():
    e = TaskException("ValueError", "bad", "Traceback ...\nValueError: bad\n")
    assert e.type == "builtins.ValueError" and e.exception == "bad" and str(e) == e.stacktrace
    assert TaskException("mymod.Err", "x", "").type == "mymod.Err"
    assert str(TaskException("TaskFailed", "x", "")) == "[no stacktrace]\nTaskFailed: x"


def test_metadata_switches_the_home(tmp_path, monkeypatch, maker):
    monkeypatch.setattr(client_base, "_home", None)
    monkeypatch.setenv("STOKER_HOME", str(tmp_path / "default"))
    assert get_metadata() == f"local@{tmp_path / 'default'}"
    maker.run("Elsewhere", "1")  # the maker's db is tmp_path/metadata.db
    assert metadata(f"local@{tmp_path}") == f"local@{tmp_path}" == get_metadata()
    assert Flow("Elsewhere", store=maker.store).latest_run.id == "1"
    assert metadata(str(tmp_path)) == f"local@{tmp_path}"
    assert default_metadata() == f"local@{tmp_path / 'default'}"
    with pytest.raises(StoreError, match="no metadata.db"):
        metadata(str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="local index only"):
        metadata("service@http://example.com")


def test_running_attempt_is_listed_unfinished(maker):
    maker.run("Live", "1", status="running")
    maker.db.register_attempt("Live", "1", "start", "1", 0, user="alice", hostname="h")
    run = Run("Live/1", **kw(maker))
    task = run["start"].task
    assert not run.finished and not task.finished and not task.successful
    md = task.metadata_dict
    assert md["attempt"] == "0" and "attempt_ok" not in md and list(task.loglines("stdout")) == []


def test_tag_cli_list_and_errors(lineage, capsys, monkeypatch):
    from stoker.cli import tag as tag_cli
    from stoker.client import namespaces as namespaces

    monkeypatch.setattr(namespaces, "default_db", lambda: lineage.db)
    monkeypatch.setattr(client_base, "default_db", lambda: lineage.db)
    monkeypatch.setattr(client_base, "default_store", lambda: lineage.store)
    args = argparse.Namespace(tag_command="add", run_id="1", user_namespace="user:alice", tags=["new"])
    assert tag_cli.tag_command("Lin", args) == 0
    assert "new" in capsys.readouterr().out
    flat = argparse.Namespace(tag_command="list", run_id=None, arg_run_id="1", list_all=False, my_runs=False,
                              hide_system_tags=False, group_by_tag=False, group_by_run=False, flat=True)
    tag_cli.tag_command("Lin", flat)
    header, *tags = capsys.readouterr().err.splitlines()  # on stderr after the header line, as Metaflow's
    assert header.startswith("stoker ") and header.endswith(" executing Lin for user:" + current_user())
    assert tags == ["new", "t1", "user:alice"]
    with pytest.raises(ConfigError, match="--run-id"):
        tag_cli.tag_command("Lin", argparse.Namespace(tag_command="add", run_id=None, user_namespace=None,
                                                      tags=["x"]))
    with pytest.raises(ConfigError, match="at least one tag to remove"):
        tag_cli.tag_command("Lin", argparse.Namespace(tag_command="replace", run_id="1", user_namespace=None,
                                                      tags_to_add=["x"], tags_to_remove=[]))
