"""Time series in the store: chunks written while a task runs, read back in order, resumed after a restart."""

from __future__ import annotations

import time

import pytest

from stoker.store.blobs import LocalBlobStore
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


def test_chunks_are_gzip_and_plain_chunks_still_read(tmp_path):
    """A week of samples stays small: chunks are gzip; older plain .jsonl chunks read too, in sequence order."""
    store = LocalBlobStore(tmp_path / "s")
    prefix = series_prefix("monitor", "F", "1", "train", "2", 0, node=0)
    store.write(f"{prefix}000001.jsonl", b'{"cpu_percent": 1}\n{torn\n')
    w = SeriesWriter(store, prefix, interval=60)
    for i in range(600):
        w.add({"cpu_percent": 50.0 + i % 7, "rss_mb": 812.5, "host_mem_used_mb": 20000 + i % 3})
    w.close()
    names = store.list(prefix)
    assert names == [f"{prefix}000001.jsonl", f"{prefix}000002.jsonl.gz"]
    assert len(store.read(names[1])) * 5 < 600 * 80, "compressed well below the plain JSON lines"
    recs = read_series(store, prefix)
    assert len(recs) == 601 and recs[0] == {"cpu_percent": 1}
