"""Conditional transitions in the graph and lint: what is parsed, what is accepted and what is refused."""

from __future__ import annotations

import pytest

from stoker.errors import GraphError
from stoker.flow.graph import FlowGraph
from stoker.flow.lint import lint
from tests.unit.flow.test_graph_errors import lint_error, load

VALID = """
class F(FlowSpec):
    @step
    def start(self):
        self.mode = "a"
        self.items = [1, 2]
        self.next({"a": self.a, 2: self.b}, condition="mode")
    @step
    def a(self):
        self.next(self.fan)
    @step
    def b(self):
        self.next(self.fan)
    @step
    def fan(self):
        self.next(self.left, self.right)
    @step
    def left(self):
        self.next({"x": self.lx, "y": self.ly}, condition="mode")
    @step
    def lx(self):
        self.next(self.join)
    @step
    def ly(self):
        self.next(self.join)
    @step
    def right(self):
        self.next(self.join)
    @step
    def join(self, inputs):
        self.next(self.spread)
    @step
    def spread(self):
        self.next(self.each, foreach="items")
    @step
    def each(self):
        self.next({"u": self.u, "v": self.v}, condition="mode")
    @step
    def u(self):
        self.next(self.join2)
    @step
    def v(self):
        self.next(self.join2)
    @step
    def join2(self, inputs):
        self.next(self.loop)
    @step
    def loop(self):
        self.next({"again": self.loop, "done": self.end}, condition="mode")
    @step
    def end(self):
        pass
"""


def test_switch_graph_parses_and_lints(tmp_path):
    cls, _ = load(tmp_path, VALID)
    g = FlowGraph(cls)
    lint(g, cls._run_inputs())
    assert g["start"].kind == "switch" and g["start"].condition == "mode"
    assert g["start"].switch_cases == {"a": "a", 2: "b"} and g["start"].out_funcs == ["a", "b"]
    assert g["fan"].split_parents == [] and sorted(g["fan"].in_funcs) == ["a", "b"]
    assert g["lx"].split_branches == ["left"] and g["ly"].split_branches == ["left"]
    assert g.branch_index("lx", "join") == 0 and g.branch_index("ly", "join") == 0
    assert g.branch_index("right", "join") == 1
    assert g["join"].split_parents == ["fan"] and g["fan"].matching_join == "join"
    assert g["spread"].matching_join == "join2" and g["u"].split_parents == ["spread"]
    assert g["loop"].is_recursive and not g["each"].is_recursive


@pytest.mark.parametrize("body, needles", [
    ("""
    class F(FlowSpec):
        @step
        def start(self):
            self.next(self.a, self.b)
        @step
        def a(self):
            self.next(self.j)
        @step
        def b(self):
            self.next(self.j)
        @step
        def j(self, inputs):
            self.next(self.c, self.d)
        @step
        def c(self):
            self.next(self.j2)
        @step
        def d(self):
            self.next(self.j2)
        @step
        def j2(self, inputs):
            self.next(self.end)
        @step
        def end(self):
            pass
    """, ["step j is both a join", "split in that step"]),
    ("""
    class F(FlowSpec):
        @step
        def start(self):
            self.next(self.a, self.b)
        @step
        def a(self):
            self.next(self.j)
        @step
        def b(self):
            self.next(self.j)
        @step
        def j(self, inputs):
            self.items = [1]
            self.next(self.end, foreach="items")
        @step
        def end(self):
            pass
    """, ["step j is both a join", "foreach"]),
    ("""
    class F(FlowSpec):
        @step
        def start(self):
            self.c = 1
            self.next(self.p, self.q)
        @step
        def p(self):
            self.next({1: self.x, 2: self.j}, condition="c")
        @step
        def x(self):
            self.next(self.j)
        @step
        def q(self):
            self.next(self.j)
        @step
        def j(self, inputs):
            self.next(self.end)
        @step
        def end(self):
            pass
    """, ["join j follows the switch in p directly", "add a step without inputs"]),
    ("""
    class F(FlowSpec):
        @step
        def start(self):
            self.c = 1
            self.next(self.work)
        @step
        def work(self):
            self.next({1: self.work2, 2: self.end}, condition="c")
        @step
        def work2(self):
            self.next(self.work)
        @step
        def end(self):
            pass
    """, ["steps form a loop", "a switch that goes back to its own step"]),
    ("""
    class F(FlowSpec):
        @step
        def start(self):
            self.c = 1
            self.next({1: self.end}, condition="c")
        @step
        def end(self):
            pass
    """, ["a switch needs at least 2 cases"]),
    ("""
    class F(FlowSpec):
        @step
        def start(self):
            self.c = 1
            key = "k"
            self.next({key: self.a, "b": self.end}, condition="c")
        @step
        def a(self):
            self.next(self.end)
        @step
        def end(self):
            pass
    """, ["case key", "literal keys"]),
    ("""
    class F(FlowSpec):
        @step
        def start(self):
            self.next({"a": self.a, "b": self.end})
        @step
        def a(self):
            self.next(self.end)
        @step
        def end(self):
            pass
    """, ["add condition="]),
    ("""
    from stoker import catch
    class F(FlowSpec):
        @catch(var="e")
        @step
        def start(self):
            self.c = 1
            self.next({1: self.a, 2: self.end}, condition="c")
        @step
        def a(self):
            self.next(self.end)
        @step
        def end(self):
            pass
    """, ["@catch is not supported on step start, a switch step"]),
    ("""
    class F(FlowSpec):
        @step
        def start(self):
            self.next(self.a, self.b)
        @step
        def a(self):
            self.next(self.x)
        @step
        def b(self):
            self.next(self.x)
        @step
        def x(self):
            self.next(self.end)
        @step
        def end(self):
            pass
    """, ["step x has several parents (a, b) but takes no inputs"]),
], ids=["join-split", "join-foreach", "switch-to-join", "loop-back", "one-case", "variable-key", "no-condition",
        "catch-on-switch", "static-branches-converge"])
def test_invalid_graphs(tmp_path, body, needles):
    msg, _ = lint_error(tmp_path, body)
    for n in needles:
        assert n in msg, msg


def test_switch_converging_without_inputs_in_a_foreach_join(tmp_path):
    """Cases of a switch in a foreach may both reach the foreach's join directly (as in Metaflow)."""
    cls, _ = load(tmp_path, """
    class F(FlowSpec):
        @step
        def start(self):
            self.items = [1, 2]
            self.next(self.each, foreach="items")
        @step
        def each(self):
            self.k = "a"
            self.next({"a": self.a, "b": self.b}, condition="k")
        @step
        def a(self):
            self.next(self.join)
        @step
        def b(self):
            self.next(self.join)
        @step
        def join(self, inputs):
            self.next(self.end)
        @step
        def end(self):
            pass
    """)
    g = FlowGraph(cls)
    lint(g, {})
    assert g.closing_split("join").name == "start"


def test_switch_next_errors():
    """self.next() with a switch: Metaflow's checks, and the RuntimeError for a value without a case."""
    from stoker import FlowSpec, step

    class G(FlowSpec):
        @step
        def start(self):
            pass

        @step
        def end(self):
            pass

    f = G._task_instance({}, lambda d, n: d, "start")
    object.__setattr__(f, "mode", "zzz")
    with pytest.raises(RuntimeError, match=r"Switch condition variable 'mode' has value 'zzz' which is not in the "
                                           r"available cases: \['a', 'b'\]"):
        f.next({"a": f.start, "b": f.end}, condition="mode")
    with pytest.raises(Exception, match="does not exist"):
        G._task_instance({}, lambda d, n: d, "start").next({"a": f.end}, condition="missing")
    with pytest.raises(Exception, match="cannot be combined"):
        G._task_instance({}, lambda d, n: d, "start").next({"a": f.end}, condition="mode", foreach="x")
    with pytest.raises(Exception, match="needs condition="):
        G._task_instance({}, lambda d, n: d, "start").next({"a": f.end})
    object.__setattr__(f, "mode", "b")
    f.__dict__["_transition"] = None
    f.next({"a": f.start, "b": f.end}, condition="mode")
    assert f.__dict__["_transition"]["steps"] == ["end"]


def test_graph_error_is_raised_for_bad_switch(tmp_path):
    cls, _ = load(tmp_path, """
    class F(FlowSpec):
        @step
        def start(self):
            self.next({"a": self.nope, "b": self.end}, condition="c")
        @step
        def end(self):
            pass
    """)
    with pytest.raises(GraphError, match="self.nope, which is not a step"):
        lint(FlowGraph(cls), {})
