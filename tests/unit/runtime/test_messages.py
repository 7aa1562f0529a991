"""The runtime's typed messages: foreach frames and gang slots keep their JSON (specs and manifests written before
still read), transitions return the tasks to start without a scheduler, and a gang's size comes from one converter."""

from __future__ import annotations

import itertools
import json

import pytest

from stoker import FlowSpec, Parameter, parallel, step
from stoker.errors import ConfigError
from stoker.flow.frames import ForeachFrame, frames_from_json
from stoker.flow.graph import FlowGraph
from stoker.flow.lint import lint
from stoker.flow.parameters import gang_size
from stoker.runtime.contract import Capabilities, Request, Unit
from stoker.runtime.driver.launch import dry_run, plan_units
from stoker.runtime.driver.queue import Task
from stoker.runtime.driver.transitions import NewTask, Transitions, first_task
from stoker.runtime.spec import GangSlot, TaskSpec

FRAME_KEYS = {"step", "var", "index", "num_splits", "desc"}
SLOT_KEYS = {"main_ip", "num_nodes", "node_index", "port", "control_task_id"}


class SplitFlow(FlowSpec):
    nodes = Parameter("nodes", default="3", type=int)  # a default the Parameter converts
    wide = Parameter("gang-width", type=int)  # its name is not its attribute's

    @step
    def start(self):
        self.items = ["a", "b", "c"]
        self.next(self.work, foreach="items")

    @step
    def work(self):
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.prep)

    @step
    def prep(self):
        self.next(self.train, num_parallel=self.nodes)

    @parallel
    @step
    def train(self):
        self.next(self.gathered)

    @step
    def gathered(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


def test_a_frame_round_trips_and_keeps_its_json():
    f = ForeachFrame(step="start", var="items", index=1, num_splits=3, desc={"sha": "x"})
    assert set(f.to_dict()) == FRAME_KEYS and ForeachFrame.from_dict(json.loads(json.dumps(f.to_dict()))) == f
    old = {"step": "start", "var": "items", "index": 0, "num_splits": 2, "value_repr": "'a'"}  # an older manifest's
    assert frames_from_json([old]) == [ForeachFrame(step="start", var="items", index=0, num_splits=2)]
    gang = ForeachFrame.from_dict({"step": "join", "var": None, "index": 2, "num_splits": 4})  # no "desc": as before
    assert gang.is_gang and gang.value() == 2 and gang.stack_entry() == (2, None, 2)
    assert f.value() is None and f.with_value(lambda: "b").stack_entry() == (1, 3, "b")
    assert f.with_value(lambda: "b") == f, "the loader is not part of the message"


def test_a_gang_slot_round_trips_and_keeps_its_json():
    slots = GangSlot.gang(3, "7")
    assert [(s.node_index, s.num_nodes, s.control_task_id, s.main_ip, s.port) for s in slots] == \
        [(0, 3, "7", None, None), (1, 3, "7", None, None), (2, 3, "7", None, None)]
    d = slots[1].to_dict()
    assert set(d) == SLOT_KEYS and GangSlot.from_dict(json.loads(json.dumps(d))) == slots[1]
    assert slots[1].started("10.0.0.1", 29500, 2) == GangSlot(main_ip="10.0.0.1", num_nodes=2, node_index=1,
                                                              port=29500, control_task_id="7")


def test_a_task_spec_round_trips_through_json_in_the_format_it_had():
    frames = [ForeachFrame(step="start", var="items", index=1, num_splits=3, desc={"sha": "x"}),
              ForeachFrame(step="join", index=0, num_splits=2)]
    spec = TaskSpec(flow="F", run_id="1", step="train", task_id="5", foreach=frames,
                    parallel=GangSlot.gang(2, "5")[0], iteration=[0])
    doc = json.loads(spec.to_json())
    assert doc["foreach"][0] == {"step": "start", "var": "items", "index": 1, "num_splits": 3, "desc": {"sha": "x"}}
    assert doc["parallel"] == {"main_ip": None, "num_nodes": 2, "node_index": 0, "port": None, "control_task_id": "5"}
    assert TaskSpec.from_json(spec.to_json()) == spec == TaskSpec.from_dict(spec.to_dict())
    head = spec.manifest_head(0.0)  # what a manifest keeps of them
    assert head["foreach_stack"] == [f.to_dict() for f in frames]
    assert head["parallel"] == {"node_index": 0, "num_nodes": 2}


def _task(step, task_id, nxt=None, foreach=(), artifacts=None):
    return Task(step=step, task_id=task_id, inputs=[], foreach=list(foreach), max_attempts=1,
                manifest={"next": nxt or {}, "artifacts": artifacts or {}})


def _transitions(cap=None):
    graph, ids = FlowGraph(SplitFlow), itertools.count(10)
    lint(graph, SplitFlow._run_inputs())  # (it finds the splits' joins)
    return Transitions(graph, lambda: str(next(ids)), cap)


def test_transitions_return_the_tasks_to_start():
    """No scheduler: a foreach's items, the join once every item arrived, then a gang numbered as one."""
    tr = _transitions()
    assert first_task(tr.graph) == NewTask("start", [], [])
    start = _task("start", "1", {"foreach_var": "items", "num_splits": 3}, artifacts={"items": {"sha": "x"}})
    items = tr.successors(start)
    assert [(n.step, n.task_id, [i.task_id for i in n.inputs]) for n in items] == [("work", None, ["1"])] * 3
    assert [n.foreach for n in items] == [[ForeachFrame(step="start", var="items", index=i, num_splits=3,
                                                        desc={"sha": "x"})] for i in range(3)]
    works = [_task("work", str(2 + i), foreach=n.foreach) for i, n in enumerate(items)]
    assert tr.successors(works[2]) == [] and tr.successors(works[0]) == []
    [join] = tr.successors(works[1])
    assert (join.step, [t.task_id for t in join.inputs], join.foreach) == ("join", ["2", "3", "4"], [])
    assert [n.step for n in tr.successors(_task("join", "5"))] == ["prep"]
    gang = tr.successors(_task("prep", "6", {"num_parallel": 2}))
    assert [(n.step, n.task_id, n.gang) for n in gang] == [("train", "10", "train-10"), ("train", "11", "train-10")]
    assert [n.parallel for n in gang] == GangSlot.gang(2, "10")
    assert [n.foreach for n in gang] == [[ForeachFrame(step="prep", index=i, num_splits=2)] for i in range(2)]
    nodes = [_task("train", n.task_id, foreach=n.foreach) for n in gang]
    assert tr.successors(nodes[0]) == []
    assert [n.step for n in tr.successors(nodes[1])] == ["gathered"]


def test_a_smoke_cap_shrinks_a_gang_before_it_is_numbered():
    tr = _transitions(cap=lambda step, n: min(n, 2))
    gang = tr.successors(_task("prep", "5", {"num_parallel": 4}))
    assert [n.task_id for n in gang] == ["10", "11"] and gang[0].parallel.num_nodes == 2


def test_the_gang_size_comes_from_the_parameter():
    params = SplitFlow._run_inputs()
    assert gang_size(4, params) == 4 and gang_size(0, params) is None
    assert gang_size("self.nodes", params) == 3, "the default, converted by the Parameter"
    assert gang_size("self.nodes", params, {"nodes": 5}) == 5
    assert gang_size("self.wide", params) is None, "no default"
    assert gang_size("self.nodes * 2", params) is None, "only the step can tell"
    assert gang_size("self.nowhere", params) is None


class FakeBackend:
    name, remote, arrays = "fake", False, False

    def capabilities(self) -> Capabilities:
        return Capabilities(cpus=64, memory_mb=1 << 20)

    def materialize(self, unit: Unit) -> Request:
        return Request(self.name, unit, f"{unit.size} {[s.parallel for s in unit.specs]}\n")


def test_plan_and_dry_run_size_a_gang_as_the_run_would():
    graph, backend = FlowGraph(SplitFlow), FakeBackend()
    train = {u.step: u for _, u in plan_units(graph, SplitFlow, lambda s: backend, "file:///s")}["train"]
    assert train.kind == "gang" and [s.parallel for s in train.specs] == GangSlot.gang(3, "T0")
    assert "step train: fake (gang, 4 member(s))" in dry_run(SplitFlow, lambda s: backend, values={"nodes": "4"})
    with pytest.raises(ConfigError, match="--nodes"):  # the text as typed, converted as a run converts it
        dry_run(SplitFlow, lambda s: backend, values={"nodes": "four"})
