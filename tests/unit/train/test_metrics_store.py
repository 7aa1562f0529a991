"""Training metrics streamed live into the run's store (issue 12, item 1).

The flow task is faked by its environment only: `stoker.store.metrics.task_env` gives the variables a real flow
task exports (tests/integration/test_metrics_flow.py checks them through a real flow); the store, the metadata
index, the trainer and TensorBoard are real.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from stoker.store.blobs import LocalBlobStore
from stoker.store.metadata import MetadataDB
from stoker.store.metrics import ENV_INTERVAL, task_env, tensorboard_prefix
from stoker.store.series import read_series, series_prefix
from stoker.train.trainer import run_training

torch.set_num_threads(1)


@pytest.fixture
def tokens(tmp_path: Path) -> Path:
    rng = np.random.default_rng(1)
    base = rng.integers(0, 256, size=97)
    path = tmp_path / "tokens.bin"
    np.concatenate([np.roll(base, i % 5) for i in range(22)]).astype(np.uint16).tofile(path)
    return path


def cfg(out: Path, tokens: Path, steps: int = 6, **sections) -> dict:
    base = {"out_dir": str(out), "data": {"url": str(tokens), "block_size": 33},
            "train": {"steps": steps, "micro_batch_size": 4, "lr": 3e-3, "log_every": 1},
            "metrics": {"progress": False, "tensorboard": False}}
    for key, value in sections.items():
        base.setdefault(key, {}).update(value)
    return base


def in_task(monkeypatch, store: LocalBlobStore, run_id: str, task_id: str, attempt: int = 0,
            interval: float = 0.05) -> str:
    """This process as the trainer of task F/run_id/train/task_id (what run_task exports); the series prefix."""
    env = task_env(store.url, "F", run_id, "train", task_id, attempt)
    for key, value in {**env, ENV_INTERVAL: str(interval)}.items():
        monkeypatch.setenv(key, value)
    return env["STOKER_METRICS_PREFIX"]


def local_records(result: dict) -> list[dict]:
    return [json.loads(line) for line in Path(result["metrics_path"]).read_text().splitlines()]


def test_series_lands_while_training_and_equals_the_local_file(tmp_path, tokens, monkeypatch):
    pytest.importorskip("tensorboard")
    store = LocalBlobStore(tmp_path / "store")
    prefix = in_task(monkeypatch, store, "1", "2")
    steps = 40
    seen_during: list[int] = []
    tb_during: list[str] = []
    tb = tensorboard_prefix("F", "1", "train", "2", 0)
    done = threading.Event()

    def watch() -> None:  # a reader polling the store as the UI would
        while not done.is_set():
            n = len(read_series(store, prefix))
            events = [name for name in store.list(tb) if "tfevents" in name]
            if not done.is_set():
                seen_during.extend([n] if n else [])
                tb_during.extend(events)
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = run_training(cfg(tmp_path / "out", tokens, steps=steps, metrics={"tensorboard": True}))
    finally:
        done.set()
        watcher.join()
    assert seen_during and min(seen_during) < steps, "no records reached the store before training ended"
    assert tb_during, "the TensorBoard event file reached the store only at the end"
    assert len([n for n in store.list(prefix) if n.endswith(".jsonl.gz")]) > 1  # appended in chunks, not one file
    streamed = read_series(store, prefix)
    assert streamed == local_records(result)
    assert [r["step"] for r in streamed] == list(range(1, steps + 1))
    assert [r["loss"] for r in streamed] == result["losses"]

    # the TensorBoard event files are in the store, with every step's loss
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    assert len([n for n in store.list(tb) if "tfevents" in n]) == 1
    mux = EventMultiplexer()  # what `tensorboard --logdir $STOKER_HOME/store/runs/F/1` reads
    mux.AddRunsFromDirectory(str(store.root / "runs" / "F" / "1"))
    mux.Reload()
    [run] = mux.Runs()
    assert run == "tensorboard/train/2/0"
    loss = mux.Scalars(run, "train/loss")
    assert [e.step for e in loss] == list(range(1, steps + 1))
    assert [e.value for e in loss] == pytest.approx(result["losses"], rel=1e-6)


def test_big_event_files_go_at_most_every_30_s_and_at_the_end(tmp_path):
    """StoreSink on its own (a real store; the event files are plain files standing in for TensorBoard's)."""
    from stoker.train.metrics import TB_SMALL, StoreSink

    store, tb_dir = LocalBlobStore(tmp_path / "store"), tmp_path / "tb"
    tb_dir.mkdir()
    (tb_dir / "old.tfevents").write_bytes(b"from an earlier run")
    sink = StoreSink(store.url, "runs/F/1/metrics/train/2/0/", tb_prefix="runs/F/1/tensorboard/train/2/0/",
                     tb_dir=tb_dir, tb_before={"old.tfevents": (19, (tb_dir / "old.tfevents").stat().st_mtime_ns)},
                     interval=3600)
    (tb_dir / "small.tfevents").write_bytes(b"x" * 100)
    sink.add({"step": 1, "loss": 2.0})
    sink.series.flush()
    assert store.list("runs/F/1/tensorboard/") == ["runs/F/1/tensorboard/train/2/0/small.tfevents"]
    (tb_dir / "big.tfevents").write_bytes(b"y" * (TB_SMALL + 1))
    sink.series.flush()  # within 30 s of the last upload: the big file waits
    assert "runs/F/1/tensorboard/train/2/0/big.tfevents" not in store.list("runs/F/1/tensorboard/")
    sink.close()
    assert store.list("runs/F/1/tensorboard/") == ["runs/F/1/tensorboard/train/2/0/big.tfevents",
                                                   "runs/F/1/tensorboard/train/2/0/small.tfevents"]
    assert read_series(store, "runs/F/1/metrics/train/2/0/")[0]["loss"] == 2.0


def test_a_failing_store_does_not_fail_training(tmp_path, tokens, monkeypatch, caplog):
    store = LocalBlobStore(tmp_path / "store")
    (store.root / "runs").write_text("not a folder")  # every write under runs/ fails
    in_task(monkeypatch, store, "1", "2")
    with caplog.at_level(logging.WARNING, logger="stoker.train.metrics"):
        result = run_training(cfg(tmp_path / "out", tokens, steps=4, train={"log_every": 1}))
    assert result["step"] == 4 and len(local_records(result)) == 4
    warnings = [r for r in caplog.records if "could not write training metrics" in r.getMessage()]
    assert len(warnings) == 1 and str(store.root) in warnings[0].getMessage()

    monkeypatch.setenv("STOKER_METRICS_STORE", "ftp://nowhere/x")  # a store that cannot even be opened
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="stoker.train.metrics"):
        result = run_training(cfg(tmp_path / "out2", tokens, steps=2))
    assert result["step"] == 2
    assert any("could not open the store ftp://nowhere/x" in r.getMessage() for r in caplog.records)


def test_outside_a_flow_nothing_goes_to_a_store(tmp_path, tokens, monkeypatch):
    for var in ("STOKER_METRICS_STORE", "STOKER_METRICS_PREFIX", "STOKER_TENSORBOARD_PREFIX"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("STOKER_STORE", str(tmp_path / "store"))
    result = run_training(cfg(tmp_path / "out", tokens, steps=2))
    assert len(local_records(result)) == 2
    assert not (tmp_path / "store" / "runs").exists()


def manifest(run_id: str, task_id: str, attempt: int, status: str, origin_task: str | None = None) -> dict:
    now = time.time()
    return {"flow": "F", "run_id": run_id, "step": "train", "task_id": task_id, "attempt": attempt,
            "status": status, "started_at": now, "finished_at": now, "artifacts": {}, "exception": None,
            "logs": {}, "input_paths": [], "foreach_stack": [], "parallel": None, "user": "tester",
            "hostname": "h", "origin_task": origin_task, "retry_count": attempt, "catch_var": None}


def test_retries_and_a_resumed_run_continue_the_curve(tmp_path, tokens, monkeypatch):
    """Run 1 trains steps 1-5 (checkpoints at 3 and 5) and fails; run 2 resumes it from step 3: its attempt 0
    trains step 4 and dies, its retry (attempt 1) trains 5-6. Run 2's curve is run 1's steps 1-3, then its own."""
    store = LocalBlobStore(tmp_path / "store")
    db = MetadataDB(tmp_path / "metadata.db")
    full = run_training(cfg(tmp_path / "full", tokens))  # the uninterrupted curve, for reference

    db.create_run("F", "1", user="tester", params={})
    in_task(monkeypatch, store, "1", "7")
    run_training(cfg(tmp_path / "one", tokens, train={"stop_after": 5}, checkpoint={"every": 3, "keep": 5}))
    db.ingest_manifest(manifest("1", "7", 0, "failed"))

    db.create_run("F", "2", user="tester", params={}, origin_run_id="1")
    in_task(monkeypatch, store, "2", "9", attempt=0)
    ckpt3 = str(tmp_path / "one" / "checkpoints" / "step_00000003")
    run_training(cfg(tmp_path / "two", tokens, train={"stop_after": 4}), resume_from=ckpt3)
    db.ingest_manifest(manifest("2", "9", 0, "failed"))
    in_task(monkeypatch, store, "2", "9", attempt=1)
    run_training(cfg(tmp_path / "two", tokens))  # the retry resumes from run 2's own checkpoint at step 4
    db.ingest_manifest(manifest("2", "9", 1, "ok"))

    from stoker.client import Run, Task

    kw = {"db": db, "store": store}
    records = Task("F/2/train/9", **kw).metrics
    assert [(r["run_id"], r["attempt"], r["step"]) for r in records] == [
        ("1", 0, 1), ("1", 0, 2), ("1", 0, 3), ("2", 0, 4), ("2", 1, 5), ("2", 1, 6)]
    assert [r["loss"] for r in records] == full["losses"]  # deterministic resume: one continuous curve
    assert len(Task("F/1/train/7", **kw).metrics) == 5  # the origin keeps its own records

    # a task cloned by resume shows its origin's records; Run.metrics names every record's task
    db.create_run("F", "3", user="tester", params={}, origin_run_id="2")
    db.ingest_manifest(manifest("3", "11", 0, "ok", origin_task="F/2/train/9"))
    rows = Run("F/3", **kw).metrics
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert {(r["step_name"], r["task_id"]) for r in rows} == {("train", "11")}
    assert Task("F/3/train/11", **kw).metrics == [{k: v for k, v in r.items() if k not in ("step_name", "task_id")}
                                                   for r in rows]
    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install pandas"):
            Run("F/3", **kw).metrics_frame()
    else:
        frame = Run("F/3", **kw).metrics_frame()
        assert list(frame["step"]) == [1, 2, 3, 4, 5, 6] and list(frame["loss"]) == full["losses"]
        assert list(Task("F/2/train/9", **kw).metrics_frame()["attempt"]) == [0, 0, 0, 0, 1, 1]
    db.close()


def test_a_series_prefix_per_attempt():
    env0, env1 = task_env("/s", "F", "1", "train", "2", 0), task_env("/s", "F", "1", "train", "2", 1)
    assert env0["STOKER_METRICS_PREFIX"] == series_prefix("metrics", "F", "1", "train", "2", 0)
    assert env1["STOKER_METRICS_PREFIX"] == "runs/F/1/metrics/train/2/1/"
    assert env1["STOKER_TENSORBOARD_PREFIX"] == "runs/F/1/tensorboard/train/2/1/"


@pytest.mark.slow
def test_through_a_real_flow(tmp_path, tokens):
    """tests/flows/metrics_flow.py: a real run, a real @torchrun child, a real retry; the task's metrics and
    TensorBoard files are in the run's store."""
    from tests.helpers import run_flow

    home = tmp_path / "home"
    run_flow("metrics_flow.py", "run", "--data", str(tokens), cwd=tmp_path,
             env={"STOKER_HOME": str(home), "STOKER_METRICS_INTERVAL": "0.2", "STOKER_STORE": ""}, timeout=300)
    import os

    os.environ["STOKER_HOME"] = str(home)
    from stoker import Flow

    run = Flow("MetricsFlow").latest_run
    task = run["train"].task
    records = task.metrics
    assert [(r["attempt"], r["step"]) for r in records] == [(0, 1), (0, 2), (1, 3)]
    assert all(isinstance(r["loss"], float) and r["run_id"] == run.id for r in records)
    assert [r["step"] for r in run.metrics] == [1, 2, 3]
    store = home / "store" / "runs" / "MetricsFlow" / run.id / "tensorboard" / "train" / task.id
    if _has_tensorboard():
        assert {p.parent.name for p in store.rglob("*tfevents*")} == {"0", "1"}


def _has_tensorboard() -> bool:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True
