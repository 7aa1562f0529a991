"""Scheduler scale (issue 13): admission looks at the units it can start, not at every pending task.

A fake backend records submissions (no processes); the work of a pass is counted as reads of `Task.state`,
which every scan over the tasks makes, so a scan of 10,000 pending tasks per unit shows up as millions.
"""

from __future__ import annotations

import random
import time

import pytest

from stoker import FlowSpec, step
from stoker.flow.frames import ForeachFrame
from stoker.flow.graph import FlowGraph
from stoker.runtime.contract import Capabilities
from stoker.runtime.driver.context import RunContext
from stoker.runtime.driver.queue import STATES, TaskIndex
from stoker.runtime.driver.scheduler import Scheduler, Task
from stoker.runtime.driver.transitions import NewTask
from stoker.store.blobs import open_store
from stoker.store.metadata import MetadataDB
from tests.helpers import run_flow


class WideFlow(FlowSpec):
    @step
    def start(self):
        self.items = list(range(3))
        self.next(self.work, foreach="items")

    @step
    def work(self):
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


class FakeBackend:
    name, remote, arrays = "fake", False, False

    def capabilities(self) -> Capabilities:
        return Capabilities(cpus=64, memory_mb=1 << 20)


def _scheduler(tmp_path, n: int, max_workers: int = 2) -> tuple[Scheduler, list[Task]]:
    backend = FakeBackend()
    ctx = RunContext(flow_cls=WideFlow, graph=FlowGraph(WideFlow), run_id="1", store=open_store(str(tmp_path / "s")),
                     db=MetadataDB(tmp_path / "db.sqlite"), router=lambda s: backend, run_inputs={}, user="u")
    sched = Scheduler(ctx, max_workers=max_workers, log_root=tmp_path / "logs")
    for i in range(n):
        sched._add(NewTask("work", [], [ForeachFrame(step="start", var="items", index=i, num_splits=n)]))
    submitted: list[Task] = []

    def submit(tasks: list[Task], backend: FakeBackend) -> None:
        for t in tasks:
            t.state, t.stopping = "running", True  # stopping: _stop_all leaves it alone
        submitted.extend(tasks)

    sched._submit = submit  # type: ignore[method-assign]
    return sched, submitted


@pytest.fixture
def state_reads(monkeypatch):
    """How many times `Task.state` was read (each scan over the tasks reads it once per task)."""
    count = [0]
    plain = object.__getattribute__

    def counting(self, name):
        if name == "state":
            count[0] += 1
        return plain(self, name)

    monkeypatch.setattr(Task, "__getattribute__", counting)
    return count


def test_admission_work_does_not_grow_with_pending_tasks(tmp_path, state_reads):
    """10,000 pending, 2 workers: each pass reads a few task states, not tens of thousands."""
    sched, submitted = _scheduler(tmp_path, 10_000)
    state_reads[0] = 0
    sched._admit()
    assert [t.task_id for t in submitted] == ["1", "2"]  # oldest first, as many as max_workers
    assert state_reads[0] <= 3 * 10_000  # each new unit enters the queue once: linear, once
    for done in range(3, 40):  # a task ends, the next one starts: the steady state of a wide foreach
        submitted[0].state = "ok"
        submitted.pop(0)
        state_reads[0] = 0
        sched._admit()
        sched._next_wakeup()
        sched._stop_all("nothing")  # only running tasks are visited
        assert submitted[-1].task_id == str(done)
        assert state_reads[0] < 50, state_reads[0]
    assert sched.index.count("running") == 2 and sched.index.count("pending") == 10_000 - 39


def test_a_retry_waits_for_its_delay_and_keeps_its_place(tmp_path):
    sched, submitted = _scheduler(tmp_path, 5, max_workers=1)
    sched._admit()
    first = submitted.pop()
    first.attempt, first.state, first.not_before = 1, "pending", time.time() + 60  # a retry in a minute
    sched._admit()
    assert [t.task_id for t in submitted] == ["2"]  # the waiting retry is skipped
    assert sched._next_wakeup() == pytest.approx(0.01)  # others are ready (not started: the worker is busy)
    submitted[0].state = "ok"
    first.not_before = 0.0  # its delay has passed (set while it waited: read when it comes due)
    sched.index._waiting = [(0.0, s, k) for _, s, k in sched.index._waiting]
    submitted.clear()
    sched._admit()
    assert [t.task_id for t in submitted] == ["1"]  # back in its original place, ahead of 3, 4, 5


def test_a_gang_is_admitted_whole_and_held_while_it_does_not_fit(tmp_path):
    sched, submitted = _scheduler(tmp_path, 1, max_workers=3)
    parent = sched.tasks[0]
    sched._add_gang("work", parent, 3)
    assert [(t.task_id, t.gang, t.parallel.node_index, t.parallel.control_task_id) for t in sched.tasks[1:]] == \
        [("2", "work-2", 0, "2"), ("3", "work-2", 1, "2"), ("4", "work-2", 2, "2")]  # numbered with the others
    sched._admit()
    assert [t.task_id for t in submitted] == ["1"]  # the gang of 3 does not fit next to it
    submitted[0].state = "ok"
    sched._admit()
    assert len(submitted) == 4 and all(t.gang for t in submitted[1:])


def test_counts_follow_every_state_change():
    index = TaskIndex()
    tasks = [Task(step="s", task_id=str(i), inputs=[], foreach=[], max_attempts=1) for i in range(200)]
    for t in tasks:
        index.add(t)
    rng = random.Random(0)
    for _ in range(2000):
        rng.choice(tasks).state = rng.choice(STATES)
    for s in STATES:
        assert set(index.in_state[s]) == {t.task_id for t in tasks if t.state == s}


@pytest.mark.slow
def test_a_500_way_foreach_completes_and_its_join_sees_every_input(tmp_path):
    """Real forked tasks, real store and index: 500 tasks, one join over 500 inputs."""
    p = run_flow("wide_foreach_flow.py", "run", "--n", "500", cwd=tmp_path,
                 env={"STOKER_HOME": str(tmp_path / "home")}, timeout=600)
    assert "wide foreach ok: 500" in p.stdout + p.stderr
    db = MetadataDB(tmp_path / "home" / "metadata.db")
    run = db.list_runs("WideForeachFlow")[0]
    assert run.status == "succeeded"
    assert len(db.list_tasks("WideForeachFlow", run.run_id, "square")) == 500
