"""Malformed flows: each is rejected before anything runs, with file:line and the fix in the message."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
import uuid

import pytest

from stoker.errors import ConfigError, GraphError
from stoker.flow.graph import FlowGraph
from stoker.flow.lint import lint

HEADER = "from stoker import FlowSpec, step, retry, parallel, Parameter\n\n"


def load(tmp_path, body: str):
    path = tmp_path / f"flow_{uuid.uuid4().hex[:8]}.py"
    path.write_text(HEADER + textwrap.dedent(body))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cls = next(v for v in vars(mod).values() if isinstance(v, type) and v.__module__ == mod.__name__)
    return cls, path


def lint_error(tmp_path, body: str) -> tuple[str, str]:
    cls, path = load(tmp_path, body)
    with pytest.raises(GraphError) as e:
        lint(FlowGraph(cls), cls._run_inputs())
    return str(e.value), str(path)


def line_of(path: str, needle: str) -> int:
    for i, line in enumerate(open(path).read().splitlines(), 1):
        if needle in line:
            return i
    raise AssertionError(needle)


CASES = {
    "no_start": ("""
        class F(FlowSpec):
            @step
            def begin(self):
                self.next(self.end)
            @step
            def end(self):
                pass
        """, ["no start step", "add `@step def start(self)`"], None),
    "no_end": ("""
        class F(FlowSpec):
            @step
            def start(self):
                self.next(self.finish)
            @step
            def finish(self):
                self.next(self.start)
        """, ["no end step"], None),
    "unknown_step": ("""
        class F(FlowSpec):
            @step
            def start(self):
                self.next(self.middel)
            @step
            def middle(self):
                self.next(self.end)
            @step
            def end(self):
                pass
        """, ["self.middel, which is not a step", "did you mean self.middle?"], "self.next(self.middel)"),
    "missing_next": ("""
        class F(FlowSpec):
            @step
            def start(self):
                self.x = 1
            @step
            def end(self):
                pass
        """, ["never calls self.next()"], "def start"),
    "end_calls_next": ("""
        class F(FlowSpec):
            @step
            def start(self):
                self.next(self.end)
            @step
            def end(self):
                self.next(self.start)
        """, ["end step must not call self.next()"], "self.next(self.start)"),
    "next_not_last": ("""
        class F(FlowSpec):
            @step
            def start(self):
                self.next(self.end)
                self.x = 2
            @step
            def end(self):
                pass
        """, ["must be the last statement"], "self.next(self.end)"),
    "conditional_next": ("""
        class F(FlowSpec):
            @step
            def start(self):
                if True:
                    self.next(self.a)
                else:
                    self.next(self.end)
            @step
            def a(self):
                self.next(self.end)
            @step
            def end(self):
                pass
        """, ["called once"], "self.next(self.a)"),
    "string_target": ("""
        class F(FlowSpec):
            @step
            def start(self):
                self.next("end")
            @step
            def end(self):
                pass
        """, ["takes steps as self.<step>"], 'self.next("end")'),
    "unreachable": ("""
        class F(FlowSpec):
            @step
            def start(self):
                self.next(self.end)
            @step
            def orphan(self):
                self.next(self.end)
            @step
            def end(self):
                pass
        """, ["step orphan is unreachable from start"], "def orphan"),
    "join_without_split": ("""
        class F(FlowSpec):
            @step
            def start(self):
                self.next(self.join)
            @step
            def join(self, inputs):
                self.next(self.end)
            @step
            def end(self):
                pass
        """, ["is a join (takes inputs) but does not follow a split"], "def join"),
    "split_without_join": ("""
        class F(FlowSpec):
            @step
            def start(self):
                self.next(self.a, self.b)
            @step
            def a(self):
                self.next(self.end)
            @step
            def b(self):
                self.next(self.end)
            @step
            def end(self):
                pass
        """, ["several parents (a, b) but takes no inputs", "def end(self, inputs)"], "def end"),
    "foreach_missing_var": ("""
        class F(FlowSpec):
            @step
            def start(self):
                self.items = [1, 2]
                self.next(self.work, foreach="itemz")
            @step
            def work(self):
                self.next(self.join)
            @step
            def join(self, inputs):
                self.next(self.end)
            @step
            def end(self):
                pass
        """, ["foreach='itemz' names an artifact that no step assigns"], 'foreach="itemz"'),
    "foreach_two_targets": ("""
        class F(FlowSpec):
            @step
            def start(self):
                self.items = [1]
                self.next(self.a, self.b, foreach="items")
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
        """, ["a foreach goes to exactly one step"], 'foreach="items"'),
    "wrong_signature": ("""
        class F(FlowSpec):
            @step
            def start(self, a, b):
                self.next(self.end)
            @step
            def end(self):
                pass
        """, ["takes 3 arguments", "a join (self, inputs)"], "def start"),
    "cycle": ("""
        class F(FlowSpec):
            @step
            def start(self):
                self.next(self.a)
            @step
            def a(self):
                self.next(self.b)
            @step
            def b(self):
                self.next(self.a)
            @step
            def end(self):
                pass
        """, ["loop (a -> b -> a)"], "def a"),
    "decorator_below_step": ("""
        class F(FlowSpec):
            @step
            @retry
            def start(self):
                self.next(self.end)
            @step
            def end(self):
                pass
        """, ["@retry is placed below @step", "put @step last"], None),
    "parallel_without_decorator": ("""
        class F(FlowSpec):
            @step
            def start(self):
                self.next(self.train, num_parallel=2)
            @step
            def train(self):
                self.next(self.join)
            @step
            def join(self, inputs):
                self.next(self.end)
            @step
            def end(self):
                pass
        """, ["started with num_parallel= but has no @parallel", "add @parallel above @step"], "def train"),
    "parallel_not_joined": ("""
        class F(FlowSpec):
            @step
            def start(self):
                self.next(self.train, num_parallel=2)
            @parallel
            @step
            def train(self):
                self.next(self.after)
            @step
            def after(self):
                self.next(self.join)
            @step
            def join(self, inputs):
                self.next(self.end)
            @step
            def end(self):
                pass
        """, ["gang step train must be followed by a join"], "def train"),
    "reserved_name": ("""
        class F(FlowSpec):
            @step
            def start(self):
                self.next(self.input)
            @step
            def input(self):
                self.next(self.end)
            @step
            def end(self):
                pass
        """, ["'input' is reserved"], None),
    "mismatched_joins": ("""
        class F(FlowSpec):
            @step
            def start(self):
                self.next(self.a, self.b)
            @step
            def a(self):
                self.next(self.j1)
            @step
            def b(self):
                self.next(self.j2)
            @step
            def j1(self, inputs):
                self.next(self.j2)
            @step
            def j2(self, inputs):
                self.next(self.end)
            @step
            def end(self):
                pass
        """, ["receives 1 of the 2 branches of start"], "def j1"),
    "end_inside_foreach": ("""
        class F(FlowSpec):
            @step
            def start(self):
                self.items = [1, 2]
                self.next(self.work, foreach="items")
            @step
            def work(self):
                self.next(self.end)
            @step
            def end(self):
                pass
        """, ["step end is reached inside the split in start"], "def end"),
    "num_parallel_zero": ("""
        class F(FlowSpec):
            @step
            def start(self):
                self.next(self.train, num_parallel=0)
            @parallel
            @step
            def train(self):
                self.next(self.join)
            @step
            def join(self, inputs):
                self.next(self.end)
            @step
            def end(self):
                pass
        """, ["num_parallel=0 must be at least 1"], "num_parallel=0"),
    "start_is_join": ("""
        class F(FlowSpec):
            @step
            def start(self, inputs):
                self.next(self.end)
            @step
            def end(self):
                pass
        """, ["start step cannot be a join"], "def start"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_flow_is_rejected_with_location_and_fix(tmp_path, case):
    body, needles, line_needle = CASES[case]
    msg, path = lint_error(tmp_path, body)
    for n in needles:
        assert n in msg, f"{case}: {n!r} not in {msg!r}"
    assert path in msg
    if line_needle:
        assert f"{path}:{line_of(path, line_needle)}:" in msg, msg


def test_there_are_at_least_fifteen_cases():
    assert len(CASES) >= 15


def test_a_parameter_named_like_a_step_is_rejected(tmp_path):
    msg, _ = lint_error(tmp_path, """
        class F(FlowSpec):
            alpha = Parameter("train", default=1)
            @step
            def start(self):
                self.next(self.train)
            @step
            def train(self):
                self.next(self.end)
            @step
            def end(self):
                pass
        """)
    assert "same name as a parameter" in msg


def test_all_problems_are_reported_at_once(tmp_path):
    msg, _ = lint_error(tmp_path, """
        class F(FlowSpec):
            @step
            def start(self):
                self.next(self.nowhere)
            @step
            def end(self):
                self.next(self.start)
        """)
    assert "2 problems" in msg and "nowhere" in msg and "end step must not call" in msg


def test_unknown_decorator_argument_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="@retry has no argument tims"):
        load(tmp_path, """
            class F(FlowSpec):
                @retry(tims=2)
                @step
                def start(self):
                    self.next(self.end)
                @step
                def end(self):
                    pass
            """)


def test_check_command_exits_nonzero_without_traceback(tmp_path):
    _, path = load(tmp_path, textwrap.dedent(CASES["unknown_step"][0]) + "\nif __name__ == '__main__':\n    F()\n")
    p = subprocess.run([sys.executable, path, "check"], capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 1
    assert "which is not a step" in p.stderr and "Traceback" not in p.stderr
    p = subprocess.run([sys.executable, path, "run"], capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 1 and "which is not a step" in p.stderr
    assert not (tmp_path / ".stoker" / "metadata.db").exists(), "a rejected flow must not create a run"
