"""When the training loop saves a checkpoint: every ``checkpoint.every`` steps, or, with ``checkpoint.every = "auto"``,
at the interval that minimises the expected lost time (Young/Daly, stoker.store.checkpoint_advice) from what this
run measures.

auto, step by step:

1. Calibration: after the loop's first ``CALIBRATION_STEPS`` steps every rank times its mean step, the ranks agree on
   the slowest figure (one all-reduce), and the first save is placed ``checkpoint.auto_first_minutes`` (10) of steps
   or ``FIRST_STEPS`` (100) steps after the loop's start, whichever comes first (at the calibration step when that
   has passed). A run shorter than the calibration saves only at its end.
2. Every save of the loop is timed (its blocking part: what Trainer.save holds the loop for; an async save's
   staging), the ranks agree on the slowest save and the slowest mean step (one all-reduce of two numbers), and the
   next save comes ``daly(save, MTBF) / mean step`` steps later. The interval is recomputed after every save, from
   that save's time (the first async save, which allocates its buffers, is slower than the next ones).
3. The MTBF is the job's: ``checkpoint.mtbf_hours``, else ``$STOKER_MTBF_HOURS``, else 24 h, each one node's MTBF,
   divided by the number of nodes (world size / ``LOCAL_WORLD_SIZE``).

Rank 0 logs each interval it chooses (``checkpoint.every=auto: every 105 steps (16.8 min; Daly, save 12 s blocking,
MTBF 12.0 h assumed (24 h per node / 2 nodes)) from step 63; expected loss 2.4 %``); the ledger's snapshots
carry the current interval (``checkpoint_every``) and ``checkpoint_policy`` ({auto, mtbf_hours, mtbf_source}), which
`stoker goodput` reads. A fixed ``every`` costs nothing here: no clock, no collective.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from stoker.errors import ConfigError
from stoker.store.checkpoint_advice import advice_words, advise, duration, given_mtbf

log = logging.getLogger(__name__)

FIRST_STEPS = 100  # auto: the first save comes at the latest this many steps into the loop
CALIBRATION_STEPS = 5  # auto: steps timed before the first save is placed


def nodes_of_world(world_size: int, env: dict[str, str] | None = None) -> int:
    """The number of nodes: world size / torchrun's ``LOCAL_WORLD_SIZE`` (1 when unknown)."""
    try:
        local = int((os.environ if env is None else env).get("LOCAL_WORLD_SIZE") or 0)
    except ValueError:
        local = 0
    return max(1, world_size // local) if local > 0 and world_size % local == 0 else 1


class CheckpointInterval:
    """What ``Trainer.fit`` asks after every step (:meth:`due`) and saves through (:meth:`save`). ``clock`` and
    ``agree`` (a list of floats -> their maximum over the ranks) are injectable; by default perf_counter and an
    all-reduce (MAX) on the trainer's device."""

    def __init__(self, trainer: Any, *, clock: Callable[[], float] = time.perf_counter,
                 agree: Callable[[list[float]], Sequence[float]] | None = None) -> None:
        cfg = trainer.cfg.checkpoint
        self.trainer, self._clock, self._agree = trainer, clock, agree or self._all_reduce_max
        self.auto = cfg.every == "auto"
        self.every = 0 if self.auto else int(cfg.every)
        self.start_step = int(trainer.step)
        self._t0, self.saving_s = clock(), 0.0
        self.next_due = self.start_step + FIRST_STEPS
        self.first_s = cfg.auto_first_minutes * 60.0
        self.choices: list[dict[str, Any]] = []  # auto: {step, save_s, step_s, every, advice} per save
        nodes = nodes_of_world(int(getattr(trainer, "world_size", 1)))
        try:
            self.mtbf_s, self.mtbf_source, self.mtbf_note = given_mtbf(cfg.mtbf_hours, nodes)
        except ConfigError:
            if self.auto:
                raise
            self.mtbf_s, self.mtbf_source, self.mtbf_note = 0.0, "", ""  # a fixed interval needs none
        ledger = getattr(trainer, "ledger", None)
        if ledger is not None:
            ledger.checkpoint_policy = {"auto": self.auto, "mtbf_hours": self.mtbf_s * nodes / 3600.0 or None,
                                        "mtbf_source": self.mtbf_source or None}

    @classmethod
    def start(cls, trainer: Any) -> CheckpointInterval:
        """The interval of one ``fit()`` (kept as ``trainer.checkpoint_interval``, its choices readable after)."""
        trainer.checkpoint_interval = interval = cls(trainer)
        return interval

    def due(self, step: int) -> bool:
        """Whether the loop saves after step ``step`` (every rank asks at every step: auto's calibration gathers)."""
        if not self.auto:
            return bool(self.every) and step % self.every == 0
        if step == self.start_step + CALIBRATION_STEPS and step < self.next_due:
            self._calibrate(step)
        return step >= self.next_due

    def save(self) -> str:
        """The trainer's save, timed; under auto the next save is placed from its time."""
        t = self._clock()
        url = self.trainer.save()
        took = self._clock() - t
        self.saving_s += took
        if self.auto:
            self._plan(int(self.trainer.step), took)
        return url

    # -- auto ------------------------------------------------------------------------------------------------------
    def _step_s(self, step: int) -> float:
        """The mean step time of this rank's loop so far, without its saves."""
        n = step - self.start_step
        return max(0.0, self._clock() - self._t0 - self.saving_s) / n if n > 0 else 0.0

    def _calibrate(self, step: int) -> None:
        (step_s,) = self._agree([self._step_s(step)])
        first = FIRST_STEPS if step_s <= 0 else min(FIRST_STEPS, max(1, math.ceil(self.first_s / step_s)))
        self.next_due = max(step, self.start_step + first)
        if self.trainer.rank == 0:
            log.info("checkpoint.every=auto: the first save, which measures the save's cost, at step %d (%s/step)",
                     self.next_due, duration(step_s))

    def _plan(self, step: int, save_s: float) -> None:
        save_s, step_s = self._agree([save_s, self._step_s(step)])
        if step_s <= 0:  # no step timed (a save at the loop's start): keep the interval
            self.next_due = step + (self.every or FIRST_STEPS)
            return
        advice = advise(save_s, step_s, self.mtbf_s, source=self.mtbf_source, mtbf_note=self.mtbf_note,
                        every_steps=self.every or None)
        changed, self.every = advice["every_steps"] != self.every, advice["every_steps"]
        self.next_due = step + self.every
        self.choices.append({"step": step, "save_s": save_s, "step_s": step_s, "every": self.every, "advice": advice})
        ledger = getattr(self.trainer, "ledger", None)
        if ledger is not None:
            ledger.checkpoint_every = self.every
        if changed and self.trainer.rank == 0:
            log.info("checkpoint.every=auto: %s from step %d; expected loss %.1f %%", advice_words(advice), step,
                     100 * advice["expected_loss"])

    def _all_reduce_max(self, values: list[float]) -> list[float]:
        """The maximum of each value over the ranks (the slowest rank sets everyone's pace)."""
        import torch.distributed as dist

        if not (dist.is_initialized() and dist.get_world_size() > 1):
            return list(values)
        import torch

        t = torch.tensor(values, dtype=torch.float32, device=self.trainer.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return [float(v) for v in t.tolist()]
