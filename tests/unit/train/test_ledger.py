"""The trainer's goodput ledger (stoker.train.ledger): activities partition its time, the committed step follows the
saves, and its snapshots reach the store (the trainer's part is checked through a real training run)."""

from __future__ import annotations

import pytest

from stoker.store.goodput import LEDGER_SERIES, latest_snapshot
from stoker.store.metrics import task_env
from stoker.store.series import read_series
from stoker.train.ledger import Ledger


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Writer:
    def __init__(self) -> None:
        self.records, self.flushes, self.closed = [], 0, False

    def add(self, record: dict) -> None:
        self.records.append(record)

    def flush(self) -> None:
        self.flushes += 1

    def close(self) -> None:
        self.closed = True


def test_activities_partition_the_time_and_snapshots_are_cumulative():
    mono, writer = Clock(), Writer()
    ledger = Ledger(lambda: writer, mono=mono, clock=lambda: 5000.0, process_started_at=4990.0)
    mono.t += 2  # building the model
    with ledger.timed("checkpoint_load"):
        mono.t += 3
    ledger.resumed(40)
    mono.t += 1
    ledger.loop_started(40, tokens_per_step=256, checkpoint_every=10)
    assert writer.flushes == 1 and writer.records[0]["loop_started_at"] == 5006.0, "the loop's start is stored at once"
    mono.t += 10  # ten steps
    with ledger.timed("checkpoint_save"):
        mono.t += 0.5
    ledger.saved(50)
    with ledger.timed("eval"):
        mono.t += 1.5
    mono.t += 4
    ledger.window(54)
    s = writer.records[-1]
    assert s["seconds"] == {"init": 3.0, "checkpoint_load": 3.0, "steps": 14.0, "checkpoint_save": 0.5, "eval": 1.5}
    assert s["time"] - s["created_at"] == pytest.approx(sum(s["seconds"].values()))
    assert (s["start_step"], s["step"], s["resumed_step"], s["committed_step"]) == (40, 54, 40, 50)
    assert (s["saves"], s["evals"], s["tokens_per_step"], s["checkpoint_every"]) == (1, 1, 256, 10)
    assert s["process_started_at"] == 4990.0 and not s["final"] and s["straggler_idle_s"] is None
    ledger.straggler_idle(0.25)
    ledger.close(55)
    assert writer.closed and writer.records[-1]["final"] and writer.records[-1]["straggler_idle_s"] == 0.25


def test_an_async_save_is_committed_when_the_next_save_or_the_end_waited_for_it():
    ledger = Ledger()
    ledger.saved(10, committed=False)
    assert ledger.committed_step is None and ledger.pending_step == 10
    ledger.saved(20, committed=False)
    assert ledger.committed_step == 10 and ledger.pending_step == 20
    ledger.close(25)
    assert ledger.committed_step == 20 and ledger.pending_step is None


def test_an_exception_leaves_the_pending_save_uncommitted():
    ledger = Ledger()
    ledger.saved(10, committed=False)
    try:
        raise RuntimeError("the loop failed")
    except RuntimeError:
        ledger.close(12)
    assert ledger.committed_step is None


def test_an_unknown_activity_is_refused():
    with pytest.raises(ValueError, match="checkpoint_save"), Ledger().timed("saving"):
        pass


def test_only_local_rank_0_of_a_flow_task_writes(tmp_path):
    env = task_env(str(tmp_path / "store"), "F", "1", "train", "2", 0)
    assert Ledger.from_env({})._factory is None, "outside a flow task nothing is written"
    assert Ledger.from_env({**env, "LOCAL_RANK": "1"})._factory is None
    ledger = Ledger.from_env({**env, "LOCAL_RANK": "0", "GROUP_RANK": "3", "STOKER_METRICS_INTERVAL": "60"})
    assert ledger.node == 3 and ledger._factory is not None


def test_a_store_that_fails_never_fails_training():
    def broken():
        raise OSError("no store")

    ledger = Ledger(broken)
    ledger.loop_started(0, 1)
    ledger.window(1)
    ledger.close(2)


def test_snapshots_land_in_the_attempts_ledger_series(tmp_path):
    from stoker.store.blobs import LocalBlobStore

    store = LocalBlobStore(tmp_path / "store")
    env = task_env(store.url, "F", "1", "train", "2", 0)
    ledger = Ledger.from_env({**env, "STOKER_METRICS_INTERVAL": "60"})
    ledger.loop_started(0, 8)
    assert len(read_series(store, env["STOKER_METRICS_PREFIX"] + LEDGER_SERIES)) == 1, "flushed at the loop's start"
    ledger.window(5)
    ledger.close(6)
    assert read_series(store, env["STOKER_METRICS_PREFIX"]) == [], "the metrics series keeps one record a step"
    last = latest_snapshot(store, "F", "1", "train", "2", 0)
    assert last["final"] and last["step"] == 6
