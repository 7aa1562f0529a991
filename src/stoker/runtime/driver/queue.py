"""The scheduler's tasks and the indices over them: no loop of the scheduler scans every task of the run.

A 10,000-way foreach has 10,000 pending tasks while 16 run: admission must look at the few it can start, not
at all of them, every time one finishes. Every change of `Task.state` goes through
`TaskIndex.moved` (the `_State` descriptor), so the counts, the per-state sets and the pending queue cannot drift
from the tasks.

The pending queue: a unit (a task, or a whole gang) enters it when it becomes pending, waits in a heap until its
`not_before` (a retry's delay) and then sits in a ready heap, oldest first, per (step, unit size). Units of one
ready heap ask for the same resources, so when one does not fit, none behind it does either in that pass:
admission blocks the heap and moves on (`Admission.hold`), which keeps each pass O(steps + units started).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from stoker.flow.frames import ForeachFrame
from stoker.runtime.contract import Backend, JobRef
from stoker.runtime.driver.output import TaskOutput
from stoker.runtime.spec import GangSlot

STATES = ("pending", "running", "ok", "failed", "killed")


def frames_key(frames: list[ForeachFrame]) -> tuple:
    """A task's place in its splits, as a resume matches it with the origin run's (`Task.key`)."""
    return tuple((f.step, f.index) for f in frames)


class _State:
    """``Task.state``: every change reaches the task's index (a data descriptor: no other attribute pays for it)."""

    def __get__(self, t: Task | None, owner: type | None = None) -> str:
        return "pending" if t is None else t.__dict__["_state"]  # (None: the dataclass asks for the default)

    def __set__(self, t: Task, value: str) -> None:
        d = t.__dict__
        old = d.get("_state")
        d["_state"] = value
        index = d.get("_index")
        if index is not None and old != value:
            index.moved(t, old, value)


@dataclass
class Task:
    step: str
    task_id: str
    inputs: list[dict]
    foreach: list[ForeachFrame]
    max_attempts: int
    parallel: GangSlot | None = None
    gang: str | None = None
    attempt: int = 0
    state: str = _State()  # type: ignore[assignment]  # pending | running | ok | failed | killed
    not_before: float = 0.0
    job: JobRef | None = None  # the submission this attempt belongs to (shared by a gang / an array)
    member: int = 0  # its place in that submission
    backend: Backend | None = None
    output: TaskOutput | None = None
    started: float = 0.0  # when the engine started it (not when it was submitted): @timeout counts from here
    deadline: float | None = None
    stopping: bool = False
    stop_reason: str | None = None  # why stoker stopped it
    engine_reason: str | None = None  # why the engine ended it (time limit, node failure, out of memory ...)
    queued_reason: str | None = None  # why the engine has not started it yet (last shown)
    manifest: dict | None = None
    exit_code: int | None = None
    cloned: bool = False
    iteration: tuple = ()  # the pass of each enclosing recursive switch (a step that switches back to itself)

    @property
    def key(self) -> tuple:
        return (self.step, frames_key(self.foreach), tuple(self.iteration))

    @property
    def unit_key(self) -> str:
        return self.gang or self.task_id

    def ref(self) -> dict:
        return {"step": self.step, "task_id": self.task_id, "attempt": self.attempt}


class TaskIndex:
    """All tasks of a run, by id, by gang and by state, and the queue of pending units."""

    def __init__(self) -> None:
        self.last_id = 0  # tasks are numbered "1", "2", ... as they are created (`new_id`)
        self.all: list[Task] = []
        self.by_id: dict[str, Task] = {}
        self.by_gang: dict[str, list[Task]] = {}
        self.in_state: dict[str, dict[str, Task]] = {s: {} for s in STATES}  # insertion-ordered sets
        self._seq: dict[str, int] = {}  # unit key -> its place in creation order
        self._incoming: dict[str, None] = {}  # units that became pending since the last pass
        self._waiting: list[tuple[float, int, str]] = []  # (not before, seq, unit key)
        self._ready: dict[tuple[str, int], list[tuple[int, str]]] = {}  # (step, size) -> [(seq, unit key)]
        self._queued: set[str] = set()  # unit keys in _waiting or _ready

    def new_id(self) -> str:
        self.last_id += 1
        return str(self.last_id)

    def add(self, t: Task) -> None:
        t.__dict__["_index"] = self
        self.all.append(t)
        self.by_id[t.task_id] = t
        if t.gang:
            self.by_gang.setdefault(t.gang, []).append(t)
        self._seq.setdefault(t.unit_key, len(self.all))
        self.in_state.setdefault(t.state, {})[t.task_id] = t
        if t.state == "pending":
            self._incoming[t.unit_key] = None

    def moved(self, t: Task, old: str | None, new: str) -> None:
        self.in_state.get(old, {}).pop(t.task_id, None)
        self.in_state.setdefault(new, {})[t.task_id] = t
        if new == "pending":
            self._incoming[t.unit_key] = None

    def count(self, state: str) -> int:
        return len(self.in_state.get(state, ()))

    def unit(self, key: str) -> list[Task]:
        return self.by_gang.get(key) or [self.by_id[key]]

    def _pending(self, key: str) -> list[Task] | None:
        unit = self.unit(key)
        return unit if all(t.state == "pending" for t in unit) else None

    def _flush(self, now: float) -> None:
        for key in self._incoming:
            unit = self._pending(key)
            if unit is not None and key not in self._queued:  # a gang is queued once its last node is pending
                self._queued.add(key)
                heapq.heappush(self._waiting, (max(t.not_before for t in unit), self._seq[key], key))
        self._incoming.clear()
        while self._waiting and self._waiting[0][0] <= now:
            _, seq, key = heapq.heappop(self._waiting)
            unit = self._pending(key)
            if unit is None:
                self._queued.discard(key)
                continue
            heapq.heappush(self._ready.setdefault((unit[0].step, len(unit)), []), (seq, key))

    def next_due(self, now: float) -> float | None:
        """When the next pending unit may start (now if one already may; None when nothing is pending)."""
        self._flush(now)
        if any(self._ready.values()):
            return now
        return self._waiting[0][0] if self._waiting else None

    def admission(self, now: float) -> Admission:
        self._flush(now)
        return Admission(self)


class Admission:
    """One pass over the ready units, oldest first; `hold` keeps a unit queued (and may block its heap)."""

    def __init__(self, index: TaskIndex) -> None:
        self.index = index
        self.heads = [(h[0][0], qk) for qk, h in index._ready.items() if h]
        heapq.heapify(self.heads)
        self.blocked: set[tuple[str, int]] = set()
        self.held: list[tuple[tuple[str, int], int, str]] = []
        self._last: tuple[tuple[str, int], int, str] | None = None

    def __iter__(self) -> Admission:
        return self

    def __next__(self) -> list[Task]:
        ready = self.index._ready
        if self._last is not None:
            self._advance(self._last[0])
        while self.heads:
            _, qk = heapq.heappop(self.heads)
            seq, key = heapq.heappop(ready[qk])
            unit = self.index._pending(key)
            if unit is None:  # no longer pending (cannot happen through the scheduler; tolerated)
                self.index._queued.discard(key)
                self._advance(qk)
                continue
            self.index._queued.discard(key)
            self._last = (qk, seq, key)
            return unit
        self._last = None
        raise StopIteration

    def _advance(self, qk: tuple[str, int]) -> None:
        self._last = None
        heap = self.index._ready[qk]
        if heap and qk not in self.blocked:
            heapq.heappush(self.heads, (heap[0][0], qk))

    def hold(self, unit: list[Task], block: bool = True) -> None:
        """Keep the unit just yielded queued; with block, yield no more units of its (step, size) this pass."""
        qk, seq, key = self._last
        self.held.append((qk, seq, key))
        self.index._queued.add(key)
        if block:
            self.blocked.add(qk)

    def close(self) -> None:
        """Put the held units back (call when the pass ends, also when it ends early)."""
        for qk, seq, key in self.held:
            heapq.heappush(self.index._ready[qk], (seq, key))
        self.held.clear()
