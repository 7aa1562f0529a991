"""The decorators' typed hooks: the engine asks them, in their order, and knows no decorator by name."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from stoker import FlowSpec, catch, environment, resources, retry, step, timeout
from stoker.features.hooks import (
    TaskHooks,
    attempt_delay_s,
    attempts_allowed,
    deadline,
    fallback_attempts,
    resources_request,
)
from stoker.features.timeout import StepTimeout
from stoker.flow.decorators import (
    DECORATORS,
    StepDecorator,
    TaskContext,
    _make,
    parse_with,
    register_decorator,
)

SRC = Path(__file__).resolve().parents[3] / "src" / "stoker"
NAMES = re.compile(r"retry|catch|timeout|environment|secrets|card|monitor|torchrun|resources|project")


class F(FlowSpec):
    @retry(times=2, minutes_between_retries=0.5)
    @catch(var="err")
    @timeout(seconds=30)
    @resources(cpu=2, memory=100)
    @environment(vars={"A": "1"})
    @step
    def start(self):
        self.next(self.end)

    @step
    def end(self):
        pass


def test_driver_hooks_give_attempts_delay_deadline_fallback_and_resources():
    assert attempts_allowed(F.start) == 3 and attempts_allowed(F.end) == 1
    assert attempt_delay_s(F.start) == 30.0 and attempt_delay_s(F.end) == 0.0
    assert deadline(F.start) == (30.0, "it exceeded its @timeout") and deadline(F.end) is None
    assert fallback_attempts(F.start, "linear")[0] == 3 and fallback_attempts(F.start, "foreach") == (0, "")
    assert resources_request(F.start) == {"cpu": 2.0, "memory": 100.0} and resources_request(F.end) == {}


def _ctx(func, attempt=0, max_attempts=1):
    spec = SimpleNamespace(attempt=attempt, max_attempts=max_attempts, step="s", flow="F", run_id="1", task_id="2",
                           tags=[])
    return TaskContext(spec=spec, flow_cls=type("X", (), {}), func=func, node=SimpleNamespace(kind="linear",
                       out_funcs=["end"]), store=None, tempdir=".", parallel=None)


def test_decorate_nests_by_order_and_finished_unwinds():
    seen = []

    class Mark(StepDecorator):
        defaults = {"n": 0}

        def task_decorate(self, ctx, call):
            def run():
                seen.append(f"in{self.name}")
                return call()
            return run

        def task_finished(self, ctx):
            seen.append(f"end{self.name}")

    inner = type("Inner", (Mark,), {"name": "inner", "order": 1})
    outer = type("Outer", (Mark,), {"name": "outer", "order": 99})

    def func(self):
        seen.append("step")

    func.decorators = [outer({}), inner({})]  # as written, the outer one first
    hooks = TaskHooks(_ctx(func))
    hooks.decorate(lambda: func(None))()
    hooks.finished()
    assert seen[:3] == ["inouter", "ininner", "step"]
    assert seen.index("endinner") > seen.index("endouter")


def test_timeout_and_catch_act_through_their_hooks(capsys):
    def slow(self):
        import time
        time.sleep(5)

    slow.decorators = [timeout.__wrapped__({"seconds": 0.2}) if hasattr(timeout, "__wrapped__") else None]
    slow.decorators = [DECORATORS["timeout"]({"seconds": 0.2}), DECORATORS["catch"]({"var": "err"})]
    ctx = _ctx(slow)
    ctx.flow = SimpleNamespace()
    hooks = TaskHooks(ctx)
    with pytest.raises(StepTimeout, match="timed out after 0.2 s"):
        hooks.decorate(lambda: slow(None))()
    ctx.last_attempt = True
    assert hooks.exception(StepTimeout("late"))
    assert ctx.manifest["catch_var"] == "err" and ctx.manifest["next"] == {"steps": ["end"]}
    assert ctx.flow.err.type.endswith("StepTimeout")
    assert "@catch: step s failed (StepTimeout: late)" in capsys.readouterr().err
    fallback = _ctx(slow, attempt=1, max_attempts=1)  # the step's own attempts spent: @catch records the failure
    with pytest.raises(Exception, match="kept failing over 1 attempts"):
        TaskHooks(fallback).decorate(lambda: slow(None))()


def test_a_new_decorator_is_one_class_and_reaches_the_engine():
    class Budget(StepDecorator):
        name = "budget_test"
        defaults = {"minutes": 1}

        def deadline_s(self):
            return 60 * self.attributes["minutes"]

    register_decorator(Budget)
    budget = _make(Budget)

    @budget(minutes=2)
    @step
    def s(self):
        pass

    assert deadline(s) == (120, "it exceeded its @budget_test")
    assert isinstance(parse_with("budget_test:minutes=3"), Budget)
    DECORATORS.pop("budget_test")


def _function_source(path: Path, name: str) -> str:
    text = path.read_text()
    start = text.index(f"\ndef {name}(")
    end = text.find("\ndef ", start + 5)
    return text[start:end if end > 0 else None]


def test_the_engine_names_no_decorator():
    sched = (SRC / "runtime" / "driver" / "scheduler.py").read_text().splitlines()
    # a module's name; the message's words
    allowed = ("from stoker.runtime.driver.resources import ResourcePool", 'retry {first.attempt + 1} of')
    assert [line for line in sched if NAMES.search(line) and not any(a in line for a in allowed)] == []
    task = SRC / "runtime" / "member" / "task.py"
    for fn in ("run_task", "_run_step", "_step_call", "_save_artifacts"):
        assert not NAMES.search(_function_source(task, fn)), fn
    body = _function_source(task, "_set_current")
    assert [m for m in NAMES.findall(body)] == ["retry"]  # current.retry_count, Metaflow's name
