"""Straggler detection: every rank times its steps (compute, data wait, collective wait); per window of steps rank 0
scores each rank and each node against the median and names those that stay slow.

Timing. :meth:`Trainer.train_step` marks the end of each phase: ``DATA`` once a batch is fetched and copied to the
device, ``COMPUTE`` after forward and backward, ``COLLECTIVE`` after the loss and gradient all-reduces and the
clip. On CUDA a mark records a ``torch.cuda.Event`` (with timing) on the current stream, and the elapsed times are
read at the window's end, when the step's own ``float(loss)`` has already synchronised the device: no extra
synchronisation. On CPU a mark reads ``time.perf_counter()``; on XLA devices (lazy tensors, which run at the
step's end) detection is off. Under FSDP and tensor parallelism the collectives run inside forward and backward
and count as compute: the ranks waiting on a slow one look busy too, so detection is weakest there (it works across
the data-parallel ranks of ZeRO-1 and DDP, and for slow data loading everywhere).

Scoring. Per window (``stragglers.window`` steps, default ``train.log_every``) every rank contributes its totals
to one ``all_gather`` of 4 numbers on the default group. On rank 0: busy = compute + data wait per step, and a
rank's score = the median busy time over its own (the lower middle for an even count: with 2 ranks, the faster
one's), so a slow rank scores below 1 while the others show what it costs them as collective wait. A node's
figures are its median rank's (node = rank // ``LOCAL_WORLD_SIZE``, set by torchrun; else the ranks' host names),
so a node is named when most of its ranks are slow, and a single slow rank as that rank; nodes are scored when
there are two or more. A node, or a rank whose node is not named, below ``stragglers.threshold`` (0.7, as NVIDIA's
resiliency extension) for ``stragglers.windows`` consecutive windows (3) is named, with a warning on rank 0::

    straggler: node 1 (host b, ranks 2-3) at 0.45 of the median for 3 windows (steps 11-40): compute
    1.20 s/step vs 540.2 ms, data 0.1 ms vs 0.1 ms

and a line when it is back above the threshold. The first window of each ``fit()`` (warm-up) is not scored.

Records. The figures go into the next metrics record (rank 0's metrics.jsonl and, in a flow task, its store
series): ``compute_s``, ``data_wait_s``, ``collective_wait_s`` (the ranks' medians per step),
``collective_wait_max_s`` (the longest rank's), ``straggler_score`` (the lowest rank score) and ``slowest_rank``;
while someone is named also ``stragglers``, a list of ``{kind ("node" or "rank"), node, rank, ranks, host, score,
windows, first_step, step, compute_s, data_s, collective_s, median_compute_s, median_data_s, message}``.
`stoker show` prints the messages under the task, the UI next to the run's training metrics. An unslowed run names
nobody: no record has ``stragglers``.

Idle time. Every rank reads the gathered figures too and adds its node's idle time to the trainer's goodput ledger
(stoker.train.ledger, ``straggler_idle``; local rank 0 writes it): per rank and step, how much longer the slowest
rank was busy than this rank or the median one, whichever is busier, capped by the rank's measured collective wait
(:func:`idle_per_step`: waiting for the median rank is the gang's normal pace, the rest is what the slowest costs);
a node's is the mean of its ranks' (they wait side by side), times the window's steps. The goodput ledger moves it
out of the productive time into ``straggler_idle``. The warm-up window is not counted; a single rank idles 0.

Test hook, not a setting: ``STOKER_TEST_SLOW_RANK=1:0.2`` (or ``1:0.2,3:0.05``) makes rank 1 sleep 0.2 s in the
compute part of each of its steps, so that detection can be checked end to end. Never set it in a real run.
"""

from __future__ import annotations

import logging
import os
import socket
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from stoker.errors import ConfigError

log = logging.getLogger(__name__)

DATA, COMPUTE, COLLECTIVE = 0, 1, 2
_BEGIN = -1
MAX_EVENTS = 1024  # CUDA events a timer keeps before it reads them (at a step's start, when they are done)
ENV_SLOW = "STOKER_TEST_SLOW_RANK"


def slow_hook(rank: int, env: dict[str, str] | None = None) -> float:
    """Seconds rank ``rank`` sleeps in each step under the test hook ``STOKER_TEST_SLOW_RANK`` (0.0 without it)."""
    text = (os.environ if env is None else env).get(ENV_SLOW, "")
    for part in filter(None, (p.strip() for p in text.split(","))):
        who, _, secs = part.partition(":")
        try:
            r, s = int(who), float(secs)
        except ValueError:
            raise ConfigError(f"{ENV_SLOW}={text!r}: give RANK:SECONDS[,RANK:SECONDS...] (a test hook)") from None
        if r == rank:
            return s
    return 0.0


# ------------------------------------------------------------------------------------------------- the timers
class StepTimer:
    """This rank's time per phase, summed over the steps of a window.

    ``begin()`` starts a step, ``mark(phase)`` ends the phase that began at the previous mark; ``take()`` returns
    ``(compute, data, collective, steps)`` in seconds since the last take and starts over. With ``event`` (a
    factory of ``torch.cuda.Event(enable_timing=True)``) a mark records an event, read only in ``take()``; the
    events are reused from window to window."""

    def __init__(self, *, event: Callable[[], Any] | None = None, sleep_s: float = 0.0,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.sleep_s, self._clock, self._event = sleep_s, clock, event
        self._totals = [0.0, 0.0, 0.0]
        self._steps = 0
        self._last = 0.0
        self._pool: list[Any] = []  # events, reused
        self._phases: list[int] = []  # the phase each recorded event ends (_BEGIN: a step's start)
        self._n = 0

    def begin(self) -> None:
        self._steps += 1
        if self._event is not None:
            if self._n >= MAX_EVENTS:  # a long window: fold the earlier steps in (done: their float(loss) waited)
                self._fold()
            self._record(_BEGIN)
        else:
            self._last = self._clock()

    def mark(self, phase: int) -> None:
        if self._event is not None:
            self._record(phase)
            return
        now = self._clock()
        self._totals[phase] += now - self._last
        self._last = now

    def slow(self) -> None:
        """The test hook's sleep (a no-op unless ``STOKER_TEST_SLOW_RANK`` names this rank)."""
        if self.sleep_s:
            time.sleep(self.sleep_s)

    def _record(self, phase: int) -> None:
        if self._n == len(self._pool):
            self._pool.append(self._event())
            self._phases.append(phase)
        self._pool[self._n].record()
        self._phases[self._n] = phase
        self._n += 1

    def _fold(self) -> None:
        """Add the recorded events' intervals to the totals and free the events for reuse."""
        if self._n:
            self._pool[self._n - 1].synchronize()  # done already: the step's float(loss) waited for it
            for i in range(1, self._n):
                phase = self._phases[i]
                if phase != _BEGIN:
                    self._totals[phase] += self._pool[i - 1].elapsed_time(self._pool[i]) / 1000.0  # ms -> s
        self._n = 0

    def take(self) -> tuple[float, float, float, int]:
        """(compute, data, collective) seconds and the number of steps since the last take; starts over."""
        self._fold()
        out = (self._totals[COMPUTE], self._totals[DATA], self._totals[COLLECTIVE], self._steps)
        self.reset()
        return out

    def reset(self) -> None:
        """Forget what was timed so far."""
        self._totals = [0.0, 0.0, 0.0]
        self._steps = self._n = 0


class NullTimer:
    """The timer when straggler detection is off (or outside ``fit()``): every call does nothing."""

    def begin(self) -> None:
        pass

    def mark(self, phase: int) -> None:
        pass

    def slow(self) -> None:
        pass


NULL_TIMER = NullTimer()


# ------------------------------------------------------------------------------------------------- the scores
@dataclass(frozen=True)
class Figures:
    """Per-step seconds of one rank over a window."""

    compute: float
    data: float
    collective: float

    @property
    def busy(self) -> float:
        return self.compute + self.data


def scores(busy: Sequence[float]) -> list[float]:
    """Each value's score: the median (the lower middle for an even count) over the value; 1.0 when either is 0."""
    mid = statistics.median_low(busy) if busy else 0.0
    return [mid / b if b > 0 and mid > 0 else 1.0 for b in busy]


def idle_per_step(figures: Sequence[Figures]) -> list[float]:
    """Each rank's idle time per step attributable to the slowest rank: how much longer the slowest rank was busy
    than this rank or the median one, whichever is busier (waiting for the median rank is the gang's normal pace, not
    a straggler's cost), and no more than the rank's measured collective wait. The slowest rank's own is 0."""
    if len(figures) < 2:
        return [0.0] * len(figures)
    slowest = max(f.busy for f in figures)
    mid = statistics.median_low(f.busy for f in figures)
    return [min(f.collective, max(0.0, slowest - max(f.busy, mid))) for f in figures]


def nodes_of(world_size: int, hosts: Sequence[str], local_world_size: int | None) -> list[int]:
    """The node of each rank: rank // local_world_size when it divides the world, else by host name (in rank order)."""
    if local_world_size and local_world_size > 0 and world_size % local_world_size == 0:
        return [r // local_world_size for r in range(world_size)]
    order: dict[str, int] = {}
    return [order.setdefault(h, len(order)) for h in hosts]


def _ms(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1000:.1f} ms"


def _span(ranks: Sequence[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    contiguous = list(ranks) == list(range(ranks[0], ranks[0] + len(ranks)))
    return f"ranks {ranks[0]}-{ranks[-1]}" if contiguous else "ranks " + ",".join(map(str, ranks))


def _median_one(figs: Sequence[Figures]) -> Figures:
    """The figures of the median one by busy time (the lower middle): what a slow one is compared with."""
    return sorted(figs, key=lambda f: f.busy)[(len(figs) - 1) // 2]


@dataclass
class Verdict:
    """One window's outcome: the metrics fields, who is named now, who was named first now, who recovered."""

    fields: dict[str, Any]
    named: list[dict[str, Any]] = field(default_factory=list)
    new: list[dict[str, Any]] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)


class StragglerDetector:
    """Rank 0's bookkeeping: feed it every rank's :class:`Figures` once per window (:meth:`update`)."""

    def __init__(self, *, nodes: Sequence[int], hosts: Sequence[str], threshold: float = 0.7, windows: int = 3) -> None:
        self.nodes, self.hosts = list(nodes), list(hosts)
        self.threshold, self.windows = threshold, windows
        self.members = {n: [r for r, m in enumerate(self.nodes) if m == n] for n in sorted(set(self.nodes))}
        self.streak: dict[tuple[str, int], int] = {}
        self.since: dict[tuple[str, int], int] = {}  # the first step of a streak's first window
        self.named: dict[tuple[str, int], float] = {}  # named at the last window -> its score then

    def update(self, figures: Sequence[Figures], *, first_step: int, step: int) -> Verdict:
        """Score the window of steps ``first_step..step`` (every rank's per-step figures, by rank)."""
        rank_scores = scores([f.busy for f in figures])
        node_figs = {n: _median_one([figures[r] for r in rs]) for n, rs in self.members.items()}
        node_scores = dict(zip(node_figs, scores([f.busy for f in node_figs.values()]), strict=True))
        slowest = min(range(len(figures)), key=rank_scores.__getitem__)
        fields: dict[str, Any] = {
            "compute_s": statistics.median_low(f.compute for f in figures),
            "data_wait_s": statistics.median_low(f.data for f in figures),
            "collective_wait_s": statistics.median_low(f.collective for f in figures),
            "collective_wait_max_s": max(f.collective for f in figures),  # what the slowest costs the others
            "straggler_score": rank_scores[slowest], "slowest_rank": slowest,
        }
        candidates = {("rank", r): s for r, s in enumerate(rank_scores)}
        if len(self.members) > 1:
            candidates.update({("node", n): s for n, s in node_scores.items()})
        for key, score in candidates.items():
            if score < self.threshold:
                if not self.streak.get(key):
                    self.since[key] = first_step
                self.streak[key] = self.streak.get(key, 0) + 1
            else:
                self.streak[key] = 0
        slow = {k for k, s in candidates.items() if self.streak[k] >= self.windows}
        named_nodes = {n for kind, n in slow if kind == "node"}
        slow = {k for k in slow if k[0] == "node" or self.nodes[k[1]] not in named_nodes}
        verdict = Verdict(fields)
        for key in sorted(slow):
            kind, who = key
            figs, peers = (node_figs[who], list(node_figs.values())) if kind == "node" else (figures[who], figures)
            entry = self._entry(key, candidates[key], figs, _median_one(peers), step)
            verdict.named.append(entry)
            if key not in self.named:
                verdict.new.append(entry)
        for key, score in self.named.items():
            if key not in slow and not self.streak[key]:  # not one whose node is named now: back above the threshold
                verdict.recovered.append(f"straggler: {self._who(key)} is back at {candidates[key]:.2f} of the "
                                         f"median (named at {score:.2f})")
        self.named = {k: candidates[k] for k in slow}
        if verdict.named:
            fields["stragglers"] = verdict.named
        return verdict

    def _who(self, key: tuple[str, int]) -> str:
        kind, who = key
        if kind == "node":
            ranks = self.members[who]
            hosts = ",".join(dict.fromkeys(self.hosts[r] for r in ranks))
            return f"node {who} (host {hosts}, {_span(ranks)})"
        return f"rank {who} (node {self.nodes[who]}, host {self.hosts[who]})"

    def _entry(self, key: tuple[str, int], score: float, figs: Figures, median: Figures, step: int) -> dict[str, Any]:
        kind, who = key
        windows, since = self.streak[key], self.since[key]
        message = (f"straggler: {self._who(key)} at {score:.2f} of the median for {windows} windows (steps "
                   f"{since}-{step}): compute {_ms(figs.compute)}/step vs {_ms(median.compute)}, data "
                   f"{_ms(figs.data)} vs {_ms(median.data)}")
        ranks = self.members[who] if kind == "node" else [who]
        return {"kind": kind, "node": who if kind == "node" else self.nodes[who],
                "rank": who if kind == "rank" else None, "ranks": ranks,
                "host": ",".join(dict.fromkeys(self.hosts[r] for r in ranks)), "score": score, "windows": windows,
                "first_step": since, "step": step, "compute_s": figs.compute, "data_s": figs.data,
                "collective_s": figs.collective, "median_compute_s": median.compute, "median_data_s": median.data,
                "message": message}


# ------------------------------------------------------------------------------------------------ the trainer's
def _cuda_event() -> Any:
    import torch

    return torch.cuda.Event(enable_timing=True)


class StragglerMonitor:
    """What ``Trainer.fit`` holds: :meth:`start` (sets the trainer's ``step_timer``), :meth:`end_step` after every
    step (all ranks; a window's end gathers) and :meth:`take` for the next metrics record."""

    def __init__(self, trainer: Any, *, timer: StepTimer | None, window: int, threshold: float, windows: int) -> None:
        self.trainer, self.timer, self.window = trainer, timer, window
        self.threshold, self.windows = threshold, windows
        self.first_step, self.warm = trainer.step + 1, True
        self.detector: StragglerDetector | None = None
        self.pending: dict[str, Any] = {}
        self.named: list[dict[str, Any]] = []  # rank 0: who is named at the last window

    @classmethod
    def start(cls, trainer: Any) -> StragglerMonitor:
        s = trainer.cfg.stragglers
        timer = None
        if s.enabled and trainer.device.type == "xla":  # lazy tensors: the host sees the tracing, not the step
            log.info("straggler detection is off on %s (lazy XLA tensors run at the step's end)", trainer.device)
        elif s.enabled:
            timer = StepTimer(event=_cuda_event if trainer.device.type == "cuda" else None,
                              sleep_s=slow_hook(trainer.rank))
        trainer.step_timer = timer or NULL_TIMER
        return cls(trainer, timer=timer, window=s.window or trainer.cfg.train.log_every, threshold=s.threshold,
                   windows=s.windows)

    def end_step(self, step: int) -> None:
        """After step ``step`` on every rank (the same steps everywhere, so all ranks gather at a window's end)."""
        if self.timer is None or step % self.window:
            return
        compute, data, collective, steps = self.timer.take()
        if self.warm:  # the first window of a fit() (compilation, allocator, loader start-up) is not scored
            self.warm = False
        elif steps:  # every rank ran the same steps: all of them gather, or none
            self._window([compute, data, collective, float(steps)], step)
        self.first_step = step + 1

    def _window(self, mine: list[float], step: int) -> None:
        rows = self._gather(mine)
        if self.detector is None:
            self.detector = self._detector()
        figures = [Figures(c / n, d / n, k / n) for c, d, k, n in rows]
        self._idle(figures, mine[3])
        if self.trainer.rank != 0:
            return
        verdict = self.detector.update(figures, first_step=self.first_step, step=step)
        self.named = verdict.named
        for entry in verdict.new:
            log.warning("%s", entry["message"])
        for line in verdict.recovered:
            log.warning("%s", line)
        self.pending = verdict.fields

    def _idle(self, figures: list[Figures], steps: float) -> None:
        """This node's ranks' idle time for the slowest rank over the window (:func:`idle_per_step`, the mean of the
        node's ranks: they wait side by side) into the trainer's goodput ledger, which writes it on local rank 0."""
        ledger = getattr(self.trainer, "ledger", None)
        if ledger is None or self.detector is None:
            return
        per_step = idle_per_step(figures)
        ranks = self.detector.members[self.detector.nodes[self.trainer.rank]]
        ledger.straggler_idle(steps * sum(per_step[r] for r in ranks) / len(ranks))

    def _gather(self, mine: list[float]) -> list[list[float]]:
        world = self.trainer.world_size
        if world == 1:
            return [mine]
        import torch
        import torch.distributed as dist

        t = torch.tensor(mine, dtype=torch.float64, device=self.trainer.device)
        out = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(out, t)
        return torch.stack(out).tolist()  # one small copy to the host: every rank's ledger needs its node's idle time

    def _detector(self) -> StragglerDetector:
        """Built at the first window (all ranks: the host names are gathered once)."""
        world = self.trainer.world_size
        hosts = [socket.gethostname()]
        if world > 1:
            import torch.distributed as dist

            hosts = [""] * world
            dist.all_gather_object(hosts, socket.gethostname())
        try:
            local = int(os.environ.get("LOCAL_WORLD_SIZE", "0"))
        except ValueError:
            local = 0
        return StragglerDetector(nodes=nodes_of(world, hosts, local), hosts=hosts, threshold=self.threshold,
                                 windows=self.windows)

    def slow_node(self) -> dict[str, Any] | None:
        """The node named a straggler at the last window (its entry), if any (rank 0): what a gang with spares may
        evict (`@torchrun(evict_stragglers=True)`)."""
        return next((e for e in self.named if e.get("kind") == "node"), None)

    def take(self) -> dict[str, Any]:
        """The last window's fields for the next metrics record (rank 0; empty elsewhere and between windows)."""
        out, self.pending = self.pending, {}
        return out
