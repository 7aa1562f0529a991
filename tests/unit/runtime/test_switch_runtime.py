"""The runtime side of switches and of @catch on dead tasks: passes of recursive switches, joins after a switch,
the fallback attempt and what a dead task's log says."""

from __future__ import annotations

import itertools
import signal
from types import SimpleNamespace

from stoker.features.catch import FALLBACK_ATTEMPTS
from stoker.flow.graph import FlowGraph
from stoker.flow.lint import lint
from stoker.runtime.driver.fallback import crash_note, died_how, wants_fallback
from stoker.runtime.driver.queue import Task
from stoker.runtime.driver.transitions import Transitions, chosen_steps, next_iteration
from tests.unit.flow.test_graph_errors import load

FLOW = """
from stoker import catch
class F(FlowSpec):
    @step
    def start(self):
        self.next(self.a, self.b)
    @step
    def a(self):
        self.k = "x"
        self.next({"x": self.ax, "y": self.ay}, condition="k")
    @step
    def ax(self):
        self.next(self.join)
    @step
    def ay(self):
        self.next(self.join)
    @catch(var="e")
    @step
    def b(self):
        self.next(self.join)
    @step
    def join(self, inputs):
        self.next(self.loop)
    @step
    def loop(self):
        self.again = "no"
        self.next({"yes": self.loop, "no": self.end}, condition="again")
    @step
    def end(self):
        pass
"""


def _sched(tmp_path):
    cls, _ = load(tmp_path, FLOW)
    graph = FlowGraph(cls)
    lint(graph, {})
    ids = itertools.count(1)
    sched = SimpleNamespace(graph=graph, flow_cls=cls, transitions=Transitions(graph, lambda: str(next(ids))))
    return sched, sched.transitions


def _task(step, nxt=None, iteration=(), task_id="1"):
    return Task(step=step, task_id=task_id, inputs=[], foreach=[], max_attempts=1, iteration=iteration,
                manifest={"next": nxt or {}})


def test_recursive_switch_passes(tmp_path):
    sched, _ = _sched(tmp_path)
    assert next_iteration(sched.graph, _task("join"), "loop") == (0,)  # entering
    assert next_iteration(sched.graph, _task("loop", iteration=(0,)), "loop") == (1,)  # going round
    assert next_iteration(sched.graph, _task("loop", iteration=(4,)), "end") == ()  # leaving
    assert next_iteration(sched.graph, _task("start"), "a") == ()


def test_switch_goes_to_its_chosen_case_only(tmp_path):
    sched, _ = _sched(tmp_path)
    assert chosen_steps(sched.graph, _task("a", {"steps": ["ay"], "condition": "k"})) == ["ay"]
    assert chosen_steps(sched.graph, _task("start", {"steps": ["a", "b"]})) == ["a", "b"]


def test_join_after_a_switch_counts_the_branch_not_the_step(tmp_path):
    _, transitions = _sched(tmp_path)
    assert transitions.arrive("join", _task("ay", task_id="4")) == []
    [join] = transitions.arrive("join", _task("b", task_id="5"))
    assert (join.step, [i.step for i in join.inputs], join.iteration) == ("join", ["ay", "b"], ())


def test_crash_note_names_the_signal():
    assert died_how(-9) == "killed by signal SIGKILL" and died_how(3) == "exited with code 3"
    assert crash_note(-signal.SIGSEGV).startswith("Task failed with a segmentation fault: its process was killed "
                                                  "by signal SIGSEGV")
    assert crash_note(-9, "it exceeded its @timeout") == \
        "Task failed: its process was killed by signal SIGKILL because it exceeded its @timeout.\n"


def test_fallback_only_after_the_steps_own_attempts(tmp_path):
    sched, _ = _sched(tmp_path)
    t = _task("b")
    t.max_attempts = 2
    t.attempt = 0
    assert not wants_fallback(sched.flow_cls, "linear", [t], t)  # a retry of its own comes first
    for attempt in range(1, 1 + FALLBACK_ATTEMPTS):
        t.attempt = attempt
        assert wants_fallback(sched.flow_cls, "linear", [t], t)
    t.attempt = 1 + FALLBACK_ATTEMPTS
    assert not wants_fallback(sched.flow_cls, "linear", [t], t)
    t.attempt = 1
    assert not wants_fallback(sched.flow_cls, "switch", [t], t)
    other = _task("end")
    other.max_attempts, other.attempt = 1, 0
    assert not wants_fallback(sched.flow_cls, "end", [other], other)  # no @catch
