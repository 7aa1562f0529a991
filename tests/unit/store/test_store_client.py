"""The Metaflow-style client over runs recorded the way the runtime records them (manifests + index)."""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pytest

from stoker._hashing import key_algo
from stoker.client import (
    DataArtifact,
    Flow,
    Metaflow,
    NamespaceMismatch,
    NotFound,
    Run,
    Step,
    Task,
    default_namespace,
    get_namespace,
    namespace,
)
from stoker.errors import StoreError

FOREACH = [{"step": "start", "var": "items", "index": i, "num_splits": 3, "value_repr": repr(v)}
           for i, v in enumerate("abc")]


@pytest.fixture
def hello(maker):
    """HelloFlow/1 (succeeded): start -> each (foreach of 3) -> end."""
    maker.run("HelloFlow", "1", params={"alpha": 0.5}, tags=["exp:one"])
    maker.task("HelloFlow", "1", "start", "1", data={"items": list("abc"), "alpha": 0.5}, stdout="starting\n")
    for i, task_id in enumerate(["4", "3", "2"]):  # task ids need not follow foreach order
        maker.task("HelloFlow", "1", "each", task_id, data={"out": i * 10}, foreach_stack=[FOREACH[i]])
    maker.task("HelloFlow", "1", "end", "5", data={"total": 30, "weights": np.arange(6.0).reshape(2, 3)},
               stderr="a warning\n")
    return maker


def client_kw(maker):
    return {"db": maker.db, "store": maker.store}


def test_flow_run_step_task_data(hello):
    kw = client_kw(hello)
    flow = Flow("HelloFlow", **kw)
    run = flow.latest_run
    assert run == Run("HelloFlow/1", **kw) and run.id == "1" and run.pathspec == "HelloFlow/1"
    assert flow["1"] == run and "1" in flow and "2" not in flow
    assert run.successful and run.finished and isinstance(run.created_at, datetime)
    assert run.finished_at >= run.created_at
    assert run.tags == {"exp:one", "user:alice"} and run.user_tags == {"exp:one"}
    assert run.parameters == {"alpha": 0.5} and run.config is None
    assert run.data.total == 30 and np.array_equal(run.data.weights, np.arange(6.0).reshape(2, 3))
    assert run.end_task.pathspec == "HelloFlow/1/end/5"
    assert [s.id for s in run] == ["end", "each", "start"]  # newest first, as Metaflow
    assert "each" in run and "nope" not in run
    start = run["start"].task
    assert start.data.items == ["a", "b", "c"] and start["alpha"].data == 0.5
    assert start.stdout == "starting\n" and start.stderr == ""
    assert run.end_task.stderr == "a warning\n"
    assert start.successful and start.finished and start.index is None and start.exception is None
    assert start.origin_pathspec is None and start.input_paths == []
    assert start.parent == Step("HelloFlow/1/start", **kw) and start.parent.parent == run
    assert run.parent == flow and [f.id for f in Metaflow(**kw).flows] == ["HelloFlow"]


def test_foreach_tasks_in_index_order(hello):
    step = Run("HelloFlow/1", **client_kw(hello))["each"]
    tasks = list(step)
    assert [t.id for t in tasks] == ["4", "3", "2"] and [t.index for t in tasks] == [0, 1, 2]
    assert [t.data.out for t in step.tasks()] == [0, 10, 20]
    assert step.task.id == "4" and step["3"].index == 1
    assert tasks[0].foreach_stack[0]["var"] == "items"


def test_artifacts_are_lazy_and_carry_sha_and_size(hello, maker):
    task = Task("HelloFlow/1/end/5", **client_kw(hello))
    art = task["weights"]
    assert isinstance(art, DataArtifact) and art.pathspec == "HelloFlow/1/end/5/weights"
    assert art.size == 48 and key_algo(art.sha) is not None and art.type == "numpy.ndarray"
    assert sorted(a.id for a in task) == ["total", "weights"] and "total" in task
    assert task.artifacts.total.sha == task["total"].sha and "weights" in task.data
    assert DataArtifact("HelloFlow/1/end/5/total", **client_kw(hello)).data == 30
    # nothing was loaded so far: removing the blob breaks only the value, not the listing
    blob = maker.store.blob_path(art.sha)
    blob.chmod(0o644)
    blob.unlink()
    fresh = Task("HelloFlow/1/end/5", **client_kw(hello))
    assert fresh["weights"].size == 48
    with pytest.raises(StoreError, match="missing from the store"):
        _ = fresh.data.weights
    with pytest.raises(AttributeError, match=r"no artifact 'nope'; it has \['total', 'weights'\]"):
        _ = fresh.data.nope
    with pytest.raises(NotFound, match="no artifact 'nope'"):
        fresh["nope"]


def test_failed_task_with_retry(maker):
    maker.run("Train", "9", status="failed")
    exc = {"type": "RuntimeError", "message": "NaN loss", "traceback": "Traceback ...\nRuntimeError: NaN loss"}
    maker.task("Train", "9", "start", "1", data={"x": 1})
    maker.task("Train", "9", "train", "2", attempt=0, status="failed", exception=exc, stderr="boom 0\n")
    maker.task("Train", "9", "train", "2", attempt=1, status="failed", exception=exc, stderr="boom 1\n",
               parallel={"node_index": 0, "num_nodes": 2})
    run = Flow("Train", **client_kw(maker)).latest_run
    assert not run.successful and run.finished and run.end_task is None and run.data is None
    task = run["train"].task
    assert not task.successful and task.finished and task.retry_count == 1 and task.current_attempt == 1
    exc = task.exception  # Metaflow's MetaflowExceptionWrapper fields; str() is the stacktrace, as there
    assert exc.type == "builtins.RuntimeError" and exc.exception == exc.message == "NaN loss"
    assert "Traceback" in exc.traceback and str(exc) == exc.stacktrace == exc.traceback
    assert task.stderr == "boom 1\n"
    assert [(a.current_attempt, a.stderr) for a in task.attempts] == [(0, "boom 0\n"), (1, "boom 1\n")]
    assert Task("Train/9/train/2", attempt=0, **client_kw(maker)).retry_count == 0
    md = task.metadata_dict
    assert md["attempt"] == "1" and md["hostname"] == "testhost" and md["parallel_num_nodes"] == "2"
    assert task.parallel == {"node_index": 0, "num_nodes": 2}


def test_running_task_and_live_log(maker):
    maker.run("Live", "1", status="running")
    maker.db.register_attempt("Live", "1", "start", "1", 0, user="alice")
    from stoker.store.manifest import log_name

    maker.store.write(log_name("Live", "1", "start", "1", 0, "stdout"), b"step 10 loss 2.3\n")
    run = Run("Live/1", **client_kw(maker))
    task = run["start"].task
    assert not run.finished and not task.finished and not task.successful
    assert task.stdout == "step 10 loss 2.3\n" and list(task) == []
    maker.db.set_run_status("Live", "1", "killed")
    assert run.finished and not run.successful and run.finished_at is not None


def test_latest_successful_run_and_tag_filters(maker):
    maker.run("F", "1", tags=["good"])
    maker.run("F", "2", status="failed", tags=["good"])
    maker.run("F", "3", status="running")
    flow = Flow("F", **client_kw(maker))
    assert flow.latest_run.id == "3" and flow.latest_successful_run.id == "1"
    assert [r.id for r in flow.runs()] == ["3", "2", "1"] and [r.id for r in flow] == ["3", "2", "1"]
    assert [r.id for r in flow.runs("good")] == ["2", "1"] and list(flow.runs("good", "bad")) == []
    run = flow["3"]
    run.add_tag("promoted")
    assert [r.id for r in flow.runs("promoted")] == ["3"]
    run.remove_tag("promoted")
    assert list(flow.runs("promoted")) == []


def test_namespaces(maker):
    maker.run("F", "1", user="alice")
    maker.run("F", "2", user="bob")
    maker.task("F", "2", "start", "1", data={"x": 1}, user="bob")
    kw = client_kw(maker)
    assert get_namespace() == "user:alice"
    flow = Flow("F", **kw)
    assert [r.id for r in flow] == ["1"] and flow.latest_run.id == "1"
    with pytest.raises(NamespaceMismatch, match=r"F/2 is not in the current namespace 'user:alice'.*"
                                               r"namespace\('user:bob'\).*namespace\(None\)"):
        Run("F/2", **kw)
    with pytest.raises(NamespaceMismatch):
        Task("F/2/start/1", **kw)
    assert namespace(None) is None and get_namespace() is None
    assert [r.id for r in flow] == ["2", "1"] and Task("F/2/start/1", **kw).data.x == 1
    namespace("user:bob")
    assert flow.latest_run.id == "2"
    assert default_namespace() == "user:alice" and [r.id for r in flow] == ["1"]
    with pytest.raises(StoreError, match="must be a tag"):
        namespace("")


def test_not_found_errors(hello):
    kw = client_kw(hello)
    with pytest.raises(NotFound, match="flow 'Nope' has no runs"):
        Flow("Nope", **kw)
    with pytest.raises(NotFound, match="run HelloFlow/77 does not exist"):
        Run("HelloFlow/77", **kw)
    with pytest.raises(KeyError):  # NotFound is a KeyError too, like Metaflow's run["missing"]
        Run("HelloFlow/1", **kw)["missing"]
    with pytest.raises(NotFound, match="must look like 'Flow/run_id'"):
        Run("HelloFlow", **kw)
    with pytest.raises(NotFound, match="task HelloFlow/1/start/99 does not exist"):
        Task("HelloFlow/1/start/99", **kw)


def test_client_reads_default_locations(maker_default):
    run = Flow("Defaults").latest_run
    assert run.data.answer == 42 and run["end"].task.stdout == "done\n"
    assert [f.id for f in Metaflow()] == ["Defaults"]
