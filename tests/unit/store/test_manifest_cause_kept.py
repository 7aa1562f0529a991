"""Issue 34, item 12: a gang node the driver stopped and finished (writing its manifest with the cause) before the
node wrote its own: the node's later manifest keeps the driver's cause (stoker.store.manifest.keep_recorded_cause, which
runtime/member/task.py calls before it stores its manifest), so the ledger never reads `cause: null`."""

from __future__ import annotations

from stoker.store.blobs import LocalBlobStore
from stoker.store.manifest import Manifest, keep_recorded_cause, read_manifest, store_manifest, write_manifest

EVIDENCE = "stopped with its gang: node 0 failed: torchrun exited with code 1"


def _head(**over) -> Manifest:
    args = dict(flow="F", run_id="1", step="train", task_id="3", attempt=0, started_at=1000.0, user="u",
                input_paths=["F/1/start/1"], foreach=[], iteration=[], parallel={"node_index": 1, "num_nodes": 2})
    return Manifest.begin(**{**args, **over})


def _the_nodes_own(store) -> dict:
    """What the node does last (run_task): its own failed manifest, after the driver's."""
    own = _head().failed("Preempted", "received SIGTERM", finished_at=1100.0)
    keep_recorded_cause(store, own)
    store_manifest(store, own)
    return read_manifest(store, "F", "1", "train", "3", 0)


def test_a_stopped_nodes_later_manifest_keeps_the_cause_the_driver_recorded(tmp_path):
    store = LocalBlobStore(tmp_path / "store")
    for _ in range(20):  # 20 gang stops: each time the driver writes first
        driver = _head().failed("TaskDied", "task process killed by signal SIGTERM", finished_at=1099.0)
        write_manifest(store, driver.with_cause("node", EVIDENCE))
        m = _the_nodes_own(store)
        assert m["exception"]["cause"] == "node" and m["exception"]["evidence"] == EVIDENCE
        assert m["exception"]["type"] == "Preempted" and m["finished_at"] == 1100.0  # the rest is the node's own


def test_nothing_to_keep(tmp_path):
    store = LocalBlobStore(tmp_path / "store")
    assert _the_nodes_own(store)["exception"].get("cause") is None  # the node first: the driver adds the cause
    ok = _head()
    ok.finish("ok", {})
    keep_recorded_cause(store, ok)
    assert ok.exception is None
