"""Straggler detection (stoker.train.stragglers) in one process: the test hook's parsing, the step timer on the host
clock and on (fake) CUDA events, the scores, the naming over consecutive windows (ranks, nodes, recovery), the
settings, the fields a single-process run writes, and `stoker show`'s lines from a run's metrics series. The
multi-process checks (a slowed rank of a real gloo gang is named, an unslowed gang names nobody) are in
test_stragglers_gang.py."""

from __future__ import annotations

import datetime as dt
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from stoker.errors import ConfigError
from stoker.train.config import from_dict
from stoker.train.settings import StragglersSection
from stoker.train.stragglers import (
    COLLECTIVE,
    COMPUTE,
    DATA,
    ENV_SLOW,
    MAX_EVENTS,
    Figures,
    StepTimer,
    StragglerDetector,
    StragglerMonitor,
    idle_per_step,
    nodes_of,
    scores,
    slow_hook,
)
from stoker.train.trainer import Trainer, run_training

torch.set_num_threads(1)


def test_the_test_hook_names_ranks_and_seconds():
    assert slow_hook(1, {ENV_SLOW: "1:0.2"}) == 0.2 and slow_hook(0, {ENV_SLOW: "1:0.2"}) == 0.0
    assert slow_hook(3, {ENV_SLOW: "1:0.2, 3:0.05"}) == 0.05 and slow_hook(2, {}) == 0.0
    with pytest.raises(ConfigError, match="RANK:SECONDS"):
        slow_hook(0, {ENV_SLOW: "one:0.2"})


def test_host_timer_sums_phases_per_window_and_starts_over():
    now = [0.0]
    timer = StepTimer(clock=lambda: now[0])
    for _ in range(2):  # two steps: data 1, compute 3 (two marks), collective 0.5
        timer.begin()
        now[0] += 1.0
        timer.mark(DATA)
        now[0] += 2.0
        timer.mark(COMPUTE)
        now[0] += 1.0
        timer.mark(COMPUTE)
        now[0] += 0.5
        timer.mark(COLLECTIVE)
        now[0] += 10.0  # between steps (optimizer, logging): nobody's phase
    assert timer.take() == (6.0, 2.0, 1.0, 2)
    assert timer.take() == (0.0, 0.0, 0.0, 0)


class FakeEvent:
    """A CUDA event stand-in: record() stamps the fake device clock (ms); elapsed_time() as torch.cuda.Event."""

    clock = 0.0
    made = 0
    synced = 0

    def __init__(self) -> None:
        FakeEvent.made += 1
        self.t: float | None = None

    def record(self) -> None:
        self.t = FakeEvent.clock

    def synchronize(self) -> None:
        FakeEvent.synced += 1

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.t is not None and end.t is not None
        return end.t - self.t


def _fake_step(timer: StepTimer, data: float, compute: float, collective: float) -> None:
    timer.begin()
    for phase, ms in ((DATA, data), (COMPUTE, compute), (COLLECTIVE, collective)):
        FakeEvent.clock += ms
        timer.mark(phase)
    FakeEvent.clock += 100.0  # between steps


def test_cuda_timer_reads_its_events_only_at_the_window_end_and_reuses_them():
    FakeEvent.made = FakeEvent.synced = 0
    timer = StepTimer(event=FakeEvent)
    for _ in range(3):
        _fake_step(timer, 1.0, 20.0, 5.0)
    assert FakeEvent.synced == 0  # nothing read (no synchronisation) during the window
    assert timer.take() == pytest.approx((0.060, 0.003, 0.015, 3))
    assert FakeEvent.synced == 1 and FakeEvent.made == 12
    for _ in range(3):
        _fake_step(timer, 2.0, 10.0, 1.0)
    assert timer.take() == pytest.approx((0.030, 0.006, 0.003, 3)) and FakeEvent.made == 12  # the same events


def test_cuda_timer_folds_a_long_window_at_a_step_start():
    FakeEvent.made = 0
    timer = StepTimer(event=FakeEvent)
    steps = MAX_EVENTS // 4 + 10
    for _ in range(steps):
        _fake_step(timer, 1.0, 2.0, 3.0)
    assert FakeEvent.made <= MAX_EVENTS + 4  # bounded: earlier steps were folded into the totals
    assert timer.take() == pytest.approx((0.002 * steps, 0.001 * steps, 0.003 * steps, steps))


def test_scores_are_the_median_over_each():
    assert scores([1.0, 1.0, 1.0]) == [1.0, 1.0, 1.0]
    assert scores([1.0, 2.0]) == [1.0, 0.5]  # two ranks: the lower middle is the faster one
    assert scores([1.0, 1.0, 1.0, 4.0]) == [1.0, 1.0, 1.0, 0.25]
    assert scores([0.0, 1.0]) == [1.0, 1.0]  # nothing timed: no score


def test_nodes_from_local_world_size_else_from_host_names():
    assert nodes_of(4, ["a", "a", "b", "b"], 2) == [0, 0, 1, 1]
    assert nodes_of(4, ["x"] * 4, 1) == [0, 1, 2, 3]
    assert nodes_of(4, ["b", "b", "a", "a"], None) == [0, 0, 1, 1]
    assert nodes_of(3, ["a", "b", "a"], 2) == [0, 1, 0]  # 2 does not divide 3: by host


def _figs(*busy: float, collective: float = 0.0) -> list[Figures]:
    return [Figures(b, 0.0, collective) for b in busy]


def test_a_slow_rank_is_named_after_n_windows_then_recovers(caplog):
    d = StragglerDetector(nodes=[0, 0, 0, 0], hosts=["h"] * 4, threshold=0.7, windows=3)
    v = d.update(_figs(0.5, 0.5, 0.5, 0.5), first_step=1, step=10)
    assert v.fields["straggler_score"] == 1.0 and "stragglers" not in v.fields and not v.new
    for i in range(2):
        v = d.update(_figs(0.5, 0.5, 1.2, 0.5), first_step=11 + 10 * i, step=20 + 10 * i)
        assert not v.named and v.fields["slowest_rank"] == 2 and v.fields["straggler_score"] == pytest.approx(0.5 / 1.2)
    v = d.update(_figs(0.5, 0.5, 1.2, 0.5), first_step=31, step=40)
    [entry] = v.new
    assert v.fields["stragglers"] == [entry] and entry["kind"] == "rank" and entry["rank"] == 2
    assert entry["windows"] == 3 and entry["first_step"] == 11 and entry["step"] == 40
    assert entry["message"] == ("straggler: rank 2 (node 0, host h) at 0.42 of the median for 3 windows (steps "
                                "11-40): compute 1.20 s/step vs 500.0 ms, data 0.0 ms vs 0.0 ms")
    v = d.update(_figs(0.5, 0.5, 1.2, 0.5), first_step=41, step=50)
    assert not v.new and v.named[0]["windows"] == 4  # still named, announced once
    v = d.update(_figs(0.5, 0.5, 0.55, 0.5), first_step=51, step=60)
    assert not v.named and "stragglers" not in v.fields
    assert v.recovered == ["straggler: rank 2 (node 0, host h) is back at 0.91 of the median (named at 0.42)"]


def test_idle_time_is_what_the_slowest_rank_costs_beyond_the_median():
    """busy 0.8 / 1.0 / 1.0 / 1.5 s per step (median, the lower middle, 1.0): each rank waits 1.5 - max(own, 1.0) =
    0.5 s for the slowest, no more than its collective wait (rank 1's 0.2 s); the slowest waits for nobody."""
    figs = [Figures(0.8, 0.0, 0.7), Figures(1.0, 0.0, 0.2), Figures(0.9, 0.1, 0.5), Figures(1.4, 0.1, 0.0)]
    assert idle_per_step(figs) == pytest.approx([0.5, 0.2, 0.5, 0.0])
    assert idle_per_step([Figures(1.0, 0.0, 0.3)]) == [0.0] and idle_per_step([]) == []
    equal = [Figures(1.0, 0.0, 0.1)] * 3
    assert idle_per_step(equal) == [0.0, 0.0, 0.0]


class _Gang(StragglerMonitor):
    """Rank ``rank`` of a 4-rank gang on 2 nodes (2 ranks each), whose gathered figures are given."""

    def __init__(self, rank: int, rows: list[list[float]]) -> None:
        from stoker.train.ledger import Ledger

        trainer = type("T", (), {"rank": rank, "world_size": 4, "step": 0, "ledger": Ledger()})()
        super().__init__(trainer, timer=None, window=10, threshold=0.7, windows=3)
        self.rows = rows

    def _gather(self, mine: list[float]) -> list[list[float]]:
        return self.rows

    def _detector(self) -> StragglerDetector:
        return StragglerDetector(nodes=[0, 0, 1, 1], hosts=["a", "a", "b", "b"])


def test_every_node_puts_its_ranks_idle_time_into_its_ledger():
    """Window of 10 steps; rank 3 (node 1) is 0.5 s per step slower: node 0's ranks both wait 0.5 s a step (5 s over
    the window, their mean), node 1's rank 2 waits 0.5 and rank 3 none (2.5 s, their mean)."""
    rows = [[10.0, 0.0, 6.0, 10], [10.0, 0.0, 6.0, 10], [10.0, 0.0, 6.0, 10], [15.0, 0.0, 1.0, 10]]
    for rank, idle in ((0, 5.0), (1, 5.0), (2, 2.5), (3, 2.5)):
        gang = _Gang(rank, rows)
        gang._window(rows[rank], step=20)
        assert gang.trainer.ledger.idle_s == pytest.approx(idle)
        assert bool(gang.pending) == (rank == 0), "rank 0 alone scores"


def test_a_streak_must_be_consecutive():
    d = StragglerDetector(nodes=[0, 0], hosts=["h", "h"], windows=3)
    for busy in (2.0, 2.0, 1.0, 2.0, 2.0, 1.0, 2.0, 2.0):
        assert not d.update(_figs(1.0, busy), first_step=1, step=2).named


def test_a_slow_node_is_named_with_its_ranks_and_they_are_not_named_again():
    d = StragglerDetector(nodes=[0, 0, 1, 1, 2, 2], hosts=["a", "a", "b", "b", "c", "c"], windows=2)
    for step in (10, 20):
        v = d.update(_figs(0.5, 0.5, 1.0, 1.2, 0.5, 0.5, collective=0.1), first_step=step - 9, step=step)
    [entry] = v.named  # not ranks 2 and 3 again
    assert entry["kind"] == "node" and entry["node"] == 1 and entry["ranks"] == [2, 3] and entry["host"] == "b"
    assert entry["message"] == ("straggler: node 1 (host b, ranks 2-3) at 0.50 of the median for 2 windows (steps "
                                "1-20): compute 1.00 s/step vs 500.0 ms, data 0.0 ms vs 0.0 ms")
    # one slow rank of a node: the node's median rank is not slow, the rank is named as itself
    d = StragglerDetector(nodes=[0, 0, 0, 1, 1, 1], hosts=["a"] * 3 + ["b"] * 3, windows=1)
    v = d.update(_figs(0.5, 0.5, 0.5, 0.5, 3.0, 0.5), first_step=1, step=10)
    assert [(e["kind"], e["rank"], e["node"]) for e in v.named] == [("rank", 4, 1)]
    assert v.named[0]["message"].startswith("straggler: rank 4 (node 1, host b) at 0.17 of the median")


def test_an_unslowed_gang_names_nobody():
    rng = np.random.default_rng(0)
    d = StragglerDetector(nodes=[r // 8 for r in range(64)], hosts=[f"n{r // 8}" for r in range(64)])
    for w in range(50):  # +-15 % noise per rank and window
        v = d.update(_figs(*(0.5 * rng.uniform(0.85, 1.15, 64))), first_step=10 * w + 1, step=10 * w + 10)
        assert not v.named and v.fields["straggler_score"] > 0.7


def test_the_settings_section():
    cfg = from_dict({"stragglers": {"window": 5, "threshold": 0.5, "windows": 2}})
    assert (cfg.stragglers.window, cfg.stragglers.threshold, cfg.stragglers.windows) == (5, 0.5, 2)
    assert cfg.stragglers.enabled and from_dict({}).stragglers == StragglersSection()
    for bad, match in (({"threshold": 1.5}, "threshold"), ({"threshold": 0}, "threshold"),
                       ({"windows": 0}, "windows"), ({"window": -1}, "window")):
        with pytest.raises(ConfigError, match=match):
            StragglersSection(**bad)


@pytest.fixture
def tokens(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, size=97)
    path = tmp_path / "tokens.bin"
    np.concatenate([np.roll(base, i % 5) for i in range(22)]).astype(np.uint16).tofile(path)
    return path


def _cfg(tmp_path: Path, tokens: Path, **stragglers) -> dict:
    return {"out_dir": str(tmp_path / "run"), "data": {"url": str(tokens), "block_size": 33},
            "train": {"steps": 6, "micro_batch_size": 4, "lr": 3e-3, "log_every": 2},
            "checkpoint": {"save_final": False, "resume": "never"}, "stragglers": stragglers,
            "metrics": {"progress": False, "tensorboard": False}}


def _records(result: dict) -> list[dict]:
    return [json.loads(line) for line in Path(result["metrics_path"]).read_text().splitlines()]


def test_a_single_rank_logs_its_split_and_names_nobody(tmp_path, tokens, monkeypatch, caplog):
    monkeypatch.setenv(ENV_SLOW, "0:0.01")  # one rank is its own median: never a straggler
    with caplog.at_level(logging.WARNING, logger="stoker.train.stragglers"):
        records = _records(run_training(_cfg(tmp_path, tokens)))
    assert [r["step"] for r in records] == [2, 4, 6]
    assert "compute_s" not in records[0]  # the first window (warm-up) is not scored
    for r in records[1:]:
        assert r["straggler_score"] == 1.0 and r["slowest_rank"] == 0 and "stragglers" not in r
        assert r["compute_s"] >= 0.01 and 0 < r["data_wait_s"] < r["compute_s"] and r["collective_wait_s"] >= 0
    assert not caplog.records


def test_off_writes_no_fields_and_the_window_is_its_own(tmp_path, tokens):
    off = _records(run_training(_cfg(tmp_path, tokens, enabled=False)))
    assert not any("compute_s" in r for r in off)
    own = _records(run_training(_cfg(tmp_path / "w", tokens, window=3)))  # windows end at 3 and 6
    assert [("compute_s" in r) for r in own] == [False, False, True]


def test_train_step_outside_fit_is_not_timed(tmp_path, tokens):
    trainer = Trainer(from_dict(_cfg(tmp_path, tokens)))
    trainer.train_step()  # the class's null timer: nothing recorded, nothing to read
    assert not hasattr(trainer.step_timer, "take")


def test_show_prints_the_named_stragglers_of_each_task(tmp_path):
    from stoker.cli.listing import show_lines, task_stragglers
    from stoker.store.blobs import LocalBlobStore
    from stoker.store.series import SeriesWriter, series_prefix

    store = LocalBlobStore(tmp_path / "store")
    d = StragglerDetector(nodes=[0, 1], hosts=["a", "b"], windows=2)
    writer = SeriesWriter(store, series_prefix("metrics", "F", "1", "train", "2", 0), interval=60)
    for step in (10, 20, 30):
        writer.add({"step": step, "loss": 1.0, **d.update(_figs(0.5, 1.0), first_step=step - 9, step=step).fields})
    writer.close()
    calm = SeriesWriter(store, series_prefix("metrics", "F", "1", "train", "3", 0), interval=60)
    calm.add({"step": 10, "loss": 1.0, "straggler_score": 1.0})
    calm.close()
    named = task_stragglers(store, "F", "1")
    assert named == {("train", "2"): ["straggler: node 1 (host b, rank 1) at 0.50 of the median for 3 windows "
                                      "(steps 1-30): compute 1.00 s/step vs 500.0 ms, data 0.0 ms vs 0.0 ms "
                                      "(attempt 0)"]}
    rec = {"pathspec": "F/1", "status": "succeeded", "user": "u", "duration_s": 3.0, "origin_run_id": None,
           "tags": [], "parameters": {}, "cost": None,
           "steps": [{"name": "train", "tasks": [{"id": "2", "attempt": 0, "successful": True, "exception": None,
                                                   "artifacts": [], "stragglers": named[("train", "2")]}]}]}
    lines = show_lines(rec, dt.datetime(2026, 1, 2), 80)
    assert all(len(line) <= 80 for line in lines)
    assert lines[2:4] == ["    task 2 (attempt 0)  artifacts: -",
                          "      straggler: node 1 (host b, rank 1) at 0.50 of the median for 3 windows"]
