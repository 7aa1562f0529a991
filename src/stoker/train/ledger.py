"""The trainer's goodput ledger: where this process's time went, measured with one clock, written to the store.

From the moment the :class:`Ledger` is made (the first thing :class:`~stoker.train.trainer.Trainer` does) the
time is split into activities that partition it (``stoker.store.goodput.ACTIVITIES``):

    init             data, model, parallelism and optimizer built (the trainer's own start-up)
    checkpoint_load  the checkpoint a resumed attempt loads
    steps            the training loop outside saves and evaluations (its logging and SIGTERM check included)
    checkpoint_save  the blocking part of each save (an async save's staging; a sync save's write and commit)
    eval             evaluations inside the loop

The trainer switches activities (``with ledger.timed("checkpoint_save"): ...``) and tells the ledger the loop's
start (:meth:`Ledger.loop_started`), each log window (:meth:`Ledger.window`, after the window's device sync, so
the steps' time is the device's) and its end (:meth:`Ledger.close`); :meth:`Ledger.saved` and
:meth:`Ledger.resumed` keep the last committed step. Nothing is timed per step and nothing synchronises the device.

Local rank 0 of every node writes a cumulative snapshot (:meth:`Ledger.snapshot`) into
``<STOKER_METRICS_PREFIX>ledger/`` (stoker.store.goodput) at the loop's start and after each committed checkpoint
(both uploaded at once), at every log window and at the end (uploaded every ``STOKER_METRICS_INTERVAL`` seconds, and
when it closes): a killed trainer leaves its latest one. Outside a flow task (no ``STOKER_METRICS_STORE``) nothing is
written. A store that fails never fails training (one warning).

Stragglers' idle time: the straggler monitor (stoker.train.stragglers) reports, every scored window, the time this
node's ranks waited for the slowest rank with :meth:`Ledger.straggler_idle`; the snapshot carries it as
``straggler_idle_s`` (None: not measured, detection off), and the goodput ledger moves it out of the productive time.
The checkpoint interval (stoker.train.interval) sets ``checkpoint_every`` (under ``checkpoint.every=auto``, the one
chosen last) and ``checkpoint_policy`` ({auto, mtbf_hours, mtbf_source}), which the interval advice reads.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from stoker.store.goodput import ACTIVITIES, LEDGER_SERIES, LEDGER_VERSION
from stoker.store.metrics import ENV_INTERVAL, ENV_PREFIX, ENV_STORE

log = logging.getLogger(__name__)


def _process_started_at() -> float | None:
    """When this process started (epoch seconds): the time before the ledger was made is the interpreter's and
    torch's imports."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - only a finer split of the start-up is lost
        return None


class Ledger:
    """One trainer process's ledger (see the module's docstring). ``writer_factory`` opens the series writer (an
    object with ``add``, ``flush`` and ``close``) when the loop starts; None: nothing is written."""

    def __init__(self, writer_factory: Callable[[], Any] | None = None, *, node: int = 0,
                 clock: Callable[[], float] = time.time, mono: Callable[[], float] = time.perf_counter,
                 process_started_at: float | None = None) -> None:
        self._mono = mono
        self._t0 = mono()
        self.created_at = clock()
        self.process_started_at = process_started_at
        self.seconds = dict.fromkeys(ACTIVITIES, 0.0)
        self.current, self._since = "init", self._t0
        self.node = node
        self.start_step: int | None = None
        self.step = 0
        self.resumed_step: int | None = None
        self.committed_step: int | None = None
        self.pending_step: int | None = None  # an async save not known to be committed yet
        self.loop_started_at: float | None = None
        self.saves = self.evals = 0
        self.tokens_per_step = self.checkpoint_every = 0
        self.checkpoint_policy: dict[str, Any] | None = None  # {auto, mtbf_hours, mtbf_source} (stoker.train.interval)
        self.idle_s: float | None = None
        self.overhead_s = 0.0  # the ledger's own time on the training thread (its snapshots and immediate uploads)
        self._factory = writer_factory
        self._writer: Any = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Ledger:
        """The ledger of this trainer process: writing to its task attempt's ledger series when the environment
        names one (a flow task's) and this is local rank 0 (torchrun's ``LOCAL_RANK``; the node is ``GROUP_RANK``)."""
        env = os.environ if env is None else env
        url, prefix = env.get(ENV_STORE, ""), env.get(ENV_PREFIX, "")
        try:
            node = int(env.get("GROUP_RANK") or 0)
            local0 = int(env.get("LOCAL_RANK") or 0) == 0
            interval = float(env.get(ENV_INTERVAL) or 5)
        except ValueError:
            node, local0, interval = 0, True, 5.0
        factory = None
        if url and prefix and local0:
            factory = lambda: _open_writer(url, prefix + LEDGER_SERIES, interval)  # noqa: E731
        return cls(factory, node=node, process_started_at=_process_started_at())

    # -- what the trainer tells it ---------------------------------------------------------------------------
    def _switch(self, activity: str) -> str:
        now = self._mono()
        self.seconds[self.current] += now - self._since
        self._since, previous, self.current = now, self.current, activity
        return previous

    @contextmanager
    def timed(self, activity: str) -> Iterator[None]:
        """The block's time counts as ``activity`` (one of ACTIVITIES); then back to what it interrupted."""
        if activity not in self.seconds:
            raise ValueError(f"unknown ledger activity {activity!r}: one of {', '.join(ACTIVITIES)}")
        previous = self._switch(activity)
        try:
            yield
        finally:
            self._switch(previous)
            if activity == "eval":
                self.evals += 1

    def resumed(self, step: int) -> None:
        """The trainer loaded the committed checkpoint of ``step``."""
        self.resumed_step = self.committed_step = int(step)

    def saved(self, step: int, *, committed: bool = True) -> None:
        """A checkpoint of ``step`` was saved: committed already (a sync save), or in the background (async: it is
        committed when the next save or the end waits for it; Checkpointer.save waits for the one before)."""
        self.saves += 1
        if self.pending_step is not None:
            self.committed_step = self.pending_step
        self.pending_step = None if committed else int(step)
        if committed:
            self.committed_step = int(step)
            self._write(flush=True)  # what a retry can keep is worth a small write at once

    def straggler_idle(self, seconds: float) -> None:
        """Add time this node's ranks spent waiting for slower ranks (measured by the per-rank timers)."""
        self.idle_s = (self.idle_s or 0.0) + max(0.0, float(seconds))

    def loop_started(self, step: int, tokens_per_step: int, checkpoint_every: int = 0) -> None:
        """The training loop starts at ``step``: from now on the time is the steps' unless timed otherwise. The first
        snapshot goes to the store at once (a trainer killed in its first seconds still says where it got)."""
        self.start_step = self.step = int(step)
        self.tokens_per_step, self.checkpoint_every = int(tokens_per_step), int(checkpoint_every)
        self._switch("steps")
        self.loop_started_at = self._epoch(self._since)
        if self._factory is not None:
            try:
                self._writer = self._factory()
            except Exception as e:  # noqa: BLE001 - a ledger must not fail training
                log.warning("could not open the store for the goodput ledger (%s: %s); training goes on",
                            type(e).__name__, e)
            self._factory = None
        self._write(flush=True)

    def window(self, step: int) -> None:
        """A log window ended at ``step`` (after the device sync): a snapshot for the store."""
        self.step = int(step)
        self._write()

    def close(self, step: int) -> None:
        """The loop ended at ``step`` (also by an exception): the final snapshot, uploaded before returning."""
        self.step = int(step)
        if self.pending_step is not None and sys.exc_info()[0] is None:  # the end waited for it (finalize)
            self.committed_step, self.pending_step = self.pending_step, None
        self._write(final=True)
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except Exception:  # noqa: BLE001
                pass

    # -- what it says ----------------------------------------------------------------------------------------
    def _epoch(self, mono: float) -> float:
        return self.created_at + (mono - self._t0)

    def snapshot(self, *, final: bool = False) -> dict[str, Any]:
        """The ledger so far (cumulative): ``time`` - ``created_at`` == the sum of ``seconds``."""
        now = self._mono()
        self.seconds[self.current] += now - self._since
        self._since = now
        out = {"kind": "ledger", "version": LEDGER_VERSION, "time": self._epoch(now), "final": final,
               "node": self.node, "process_started_at": self.process_started_at, "created_at": self.created_at,
               "loop_started_at": self.loop_started_at, "seconds": {k: round(v, 6) for k, v in self.seconds.items()},
               "start_step": self.start_step, "step": self.step, "resumed_step": self.resumed_step,
               "committed_step": self.committed_step, "pending_step": self.pending_step, "saves": self.saves,
               "evals": self.evals, "tokens_per_step": self.tokens_per_step,
               "checkpoint_every": self.checkpoint_every, "checkpoint_policy": self.checkpoint_policy,
               "straggler_idle_s": self.idle_s,
               "overhead_s": round(self.overhead_s, 6)}
        self.overhead_s += self._mono() - now
        return out

    def _write(self, *, final: bool = False, flush: bool = False) -> None:
        if self._writer is None:
            return
        try:
            self._writer.add(self.snapshot(final=final))
            if flush:
                start = self._mono()
                self._writer.flush()
                self.overhead_s += self._mono() - start
        except Exception:  # noqa: BLE001 - a ledger must not fail training
            pass


def _open_writer(url: str, prefix: str, interval: float) -> Any:
    import threading

    from stoker.store.blobs import open_store
    from stoker.store.series import SeriesWriter

    class Series(SeriesWriter):
        """A series writer whose flushes (its thread's and the trainer's, after a save) take turns: two at once
        would write the same chunk number."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.turn = threading.Lock()  # before the writer's thread starts
            super().__init__(*args, **kwargs)

        def flush(self) -> bool:
            with self.turn:
                return super().flush()

    return Series(open_store(url), prefix, interval=interval if interval > 0 else 5.0)
