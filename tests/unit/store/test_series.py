"""Time series in the store: chunks written while a task runs, read back in order, resumed after a restart."""

from __future__ import annotations

import time

import pytest

from stoker.store import LocalBlobStore
from stoker.store.series import SeriesWriter, read_series, series_prefix


def test_chunks_land_while_running_and_read_in_order(tmp_path):
    store = LocalBlobStore(tmp_path / "s")
    prefix = series_prefix("metrics", "F", "1", "train", "2", 0)
    assert prefix == "runs/F/1/metrics/train/2/0/"
    w = SeriesWriter(store, prefix, interval=0.05)
    w.add({"step": 1, "loss": 2.0})
    deadline = time.time() + 5
    while not read_series(store, prefix) and time.time() < deadline:
        time.sleep(0.02)
    assert [r["step"] for r in read_series(store, prefix)] == [1], "written before close"
    for i in range(2, 6):
        w.add({"step": i, "loss": float("nan") if i == 3 else 1.0 / i})
    w.close()
    recs = read_series(store, prefix)
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 5] and recs[2]["loss"] is None and "time" in recs[0]
    again = SeriesWriter(store, prefix, interval=60)  # the same attempt written again goes on after it
    again.add({"step": 6})
    again.close()
    assert [r["step"] for r in read_series(store, prefix)][-1] == 6


def test_monitor_series_per_node_and_kinds(tmp_path):
    store = LocalBlobStore(tmp_path / "s")
    p0, p1 = (series_prefix("monitor", "F", "1", "train", "2", 0, node=n) for n in (0, 1))
    for p, v in ((p0, 10.0), (p1, 20.0)):
        w = SeriesWriter(store, p, interval=60)
        w.add({"cpu_percent": v})
        w.close()
    assert read_series(store, p1)[0]["cpu_percent"] == 20.0 and len(read_series(store, p0)) == 1
    with pytest.raises(ValueError, match="unknown series kind"):
        series_prefix("nope", "F", "1", "s", "1", 0)
