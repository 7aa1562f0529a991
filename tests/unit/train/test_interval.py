"""`checkpoint.every = "auto"` (stoker.train.interval): the first save after the calibration, then the interval Daly's
formula gives from the save time the trainer measured; a fixed interval as before; and a real training run."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from stoker.errors import ConfigError
from stoker.store.checkpoint_advice import daly, steps_for
from stoker.train.config import from_dict
from stoker.train.interval import CALIBRATION_STEPS, CheckpointInterval, nodes_of_world
from stoker.train.ledger import Ledger
from stoker.train.settings import CheckpointSection

torch.set_num_threads(1)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class FakeTrainer:
    """What CheckpointInterval uses of a Trainer: its config, step, rank, world size, ledger and save()."""

    def __init__(self, clock: Clock, save_s: float, world_size: int = 1, **checkpoint) -> None:
        self.cfg = from_dict({"checkpoint": checkpoint})
        self.clock, self.save_s = clock, save_s
        self.step, self.rank, self.world_size = 0, 0, world_size
        self.ledger = Ledger()
        self.saved: list[int] = []

    def save(self) -> str:
        self.clock.t += self.save_s  # the save's blocking part
        self.saved.append(self.step)
        return f"step_{self.step}"


def loop(trainer: FakeTrainer, interval: CheckpointInterval, steps: int, step_s: float) -> None:
    for step in range(trainer.step + 1, steps + 1):
        trainer.clock.t += step_s
        trainer.step = step
        if interval.due(step) and step < steps:
            interval.save()


def test_auto_places_the_first_save_then_follows_daly_from_the_measured_save(monkeypatch, caplog):
    """Steps of 9.6 s and saves of 12 s blocking, MTBF 4 h: calibrated after 5 steps, the first save comes at 10
    minutes' worth of steps (ceil(600 / 9.6) = 63), then every round(daly(12, 14400) / 9.6) = round(60.41) = 60."""
    monkeypatch.delenv("STOKER_MTBF_HOURS", raising=False)
    clock = Clock()
    trainer = FakeTrainer(clock, save_s=12.0, every="auto", mtbf_hours=4.0)
    agreed: list[list[float]] = []
    interval = CheckpointInterval(trainer, clock=clock, agree=lambda v: agreed.append(list(v)) or v)
    assert interval.auto and interval.every == 0 and interval.mtbf_s == 4 * 3600
    assert trainer.ledger.checkpoint_policy == {"auto": True, "mtbf_hours": 4.0, "mtbf_source": "setting"}
    with caplog.at_level(logging.INFO, logger="stoker.train.interval"):
        loop(trainer, interval, 250, step_s=9.6)
    assert agreed[0] == [pytest.approx(9.6)], "the calibration agrees on the mean step time"
    assert trainer.saved == [63, 123, 183, 243]
    first = interval.choices[0]
    assert first["save_s"] == pytest.approx(12.0) and first["step_s"] == pytest.approx(9.6)
    assert first["every"] == 60 == round(daly(12.0, 4 * 3600) / 9.6)
    assert first["advice"]["daly_s"] == pytest.approx(579.9048, abs=1e-4)
    assert trainer.ledger.checkpoint_every == 60
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == ("checkpoint.every=auto: the first save, which measures the save's cost, at step 63 "
                           "(9.6 s/step)")
    assert messages[1].startswith("checkpoint.every=auto: every 60 steps (9.6 min; Daly, save 12 s blocking, MTBF "
                                  "4.0 h given (checkpoint.mtbf_hours=4 h)) from step 63; expected loss 4.1 %")
    assert len(messages) == 2, "an unchanged interval is not logged again"


def test_a_slower_rank_and_more_nodes_change_the_interval(monkeypatch):
    """The ranks agree on the slowest save (here another rank's 20 s) and the job's MTBF is one node's over the
    nodes (4 ranks, 2 per node: 24 h / 2)."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.delenv("STOKER_MTBF_HOURS", raising=False)
    clock = Clock()
    trainer = FakeTrainer(clock, save_s=5.0, world_size=4, every="auto", auto_first_minutes=1.0)
    interval = CheckpointInterval(trainer, clock=clock, agree=lambda v: [max(x, 20.0) if len(v) == 2 and i == 0
                                                                          else x for i, x in enumerate(v)])
    assert interval.mtbf_s == 12 * 3600 and interval.mtbf_note == "assumed (24 h per node / 2 nodes)"
    loop(trainer, interval, 40, step_s=2.0)
    assert trainer.saved[0] == 30, "1 minute of 2 s steps"
    choice = interval.choices[0]
    assert choice["save_s"] == 20.0 and choice["every"] == steps_for(daly(20.0, 12 * 3600), 2.0) == 651


def test_a_calibration_past_the_first_save_saves_at_once_and_a_fixed_interval_is_kept(monkeypatch):
    monkeypatch.delenv("STOKER_MTBF_HOURS", raising=False)
    clock = Clock()
    slow = FakeTrainer(clock, save_s=1.0, every="auto")
    interval = CheckpointInterval(slow, clock=clock, agree=lambda v: v)
    loop(slow, interval, 8, step_s=300.0)  # 5 steps are 25 minutes: past the 10 minutes of the first save
    assert slow.saved[0] == CALIBRATION_STEPS
    fixed = FakeTrainer(clock, save_s=1.0, every=3)
    interval = CheckpointInterval(fixed, clock=clock, agree=lambda v: pytest.fail("a fixed interval agrees nothing"))
    loop(fixed, interval, 10, step_s=1.0)
    assert fixed.saved == [3, 6, 9] and not interval.choices and fixed.ledger.checkpoint_policy["auto"] is False


def test_the_settings():
    assert CheckpointSection(every="AUTO").every == "auto" and CheckpointSection(every=5).every == 5
    for bad in ({"every": "sometimes"}, {"every": -1}, {"every": True}, {"mtbf_hours": -1.0},
                {"auto_first_minutes": 0.0}):
        with pytest.raises(ConfigError):
            CheckpointSection(**bad)
    assert from_dict({}, source="x").checkpoint.every == 0
    assert nodes_of_world(8, {"LOCAL_WORLD_SIZE": "4"}) == 2 and nodes_of_world(8, {}) == 1
    assert nodes_of_world(6, {"LOCAL_WORLD_SIZE": "4"}) == 1


@pytest.fixture
def tokens(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, size=97)
    path = tmp_path / "tokens.bin"
    np.concatenate([np.roll(base, i % 5) for i in range(22)]).astype(np.uint16).tofile(path)  # 64 x 33
    return path


def test_a_training_run_with_every_auto_saves_at_the_intervals_it_measured(tmp_path, tokens, monkeypatch, caplog):
    """The real trainer: the first save right after the calibration (a first save due at once), then each next save
    the interval Daly gives from that save's measured time and the mean step time; the checkpoints on disk agree."""
    from stoker.train.trainer import Trainer

    monkeypatch.delenv("STOKER_MTBF_HOURS", raising=False)
    steps = 40
    cfg = from_dict({"out_dir": str(tmp_path / "run"), "data": {"url": str(tokens), "block_size": 33},
                     "train": {"steps": steps, "micro_batch_size": 4, "lr": 3e-3, "log_every": 10},
                     "checkpoint": {"every": "auto", "mtbf_hours": 1e-4, "auto_first_minutes": 1e-6, "keep": 100},
                     "metrics": {"progress": False, "tensorboard": False}})
    trainer = Trainer(cfg)
    with caplog.at_level(logging.INFO, logger="stoker.train.interval"):
        trainer.fit()
    interval = trainer.checkpoint_interval
    choices = interval.choices
    assert choices and choices[0]["step"] == CALIBRATION_STEPS
    for choice in choices:
        assert choice["save_s"] > 0 and choice["step_s"] > 0
        assert choice["every"] == steps_for(daly(choice["save_s"], 0.36), choice["step_s"])
    assert [c["step"] for c in choices[1:]] == [c["step"] + c["every"] for c in choices[:-1]]
    assert choices[-1]["step"] + choices[-1]["every"] >= steps
    on_disk = sorted(int(p.name.split("_")[1]) for p in (tmp_path / "run" / "checkpoints").glob("step_*"))
    assert on_disk == [c["step"] for c in choices] + [steps]
    assert any(r.getMessage().startswith(f"checkpoint.every=auto: every {choices[0]['every']} steps")
               for r in caplog.records)
    assert trainer.ledger.checkpoint_every == choices[-1]["every"]
