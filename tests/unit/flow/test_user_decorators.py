"""Custom decorators and mutators (flow/user_decorators.py, flow/mutables.py, features/user_wrappers.py) without
a run: how they attach, what a mutator may change and when, and how the wrappers run around a step."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from stoker import (
    USER_SKIP_STEP,
    FlowMutator,
    FlowSpec,
    Parameter,
    StepMutator,
    UserStepDecorator,
    environment,
    retry,
    step,
    user_step_decorator,
)
from stoker.errors import ConfigError, StokerError
from stoker.features.user_wrappers import run_wrapped
from stoker.flow.graph import FlowGraph
from stoker.flow.mutables import IGNORE, OVERRIDE, MutableFlow, MutableStep, apply_user_decorators
from stoker.flow.user_decorators import flow_class_of, parse_decospec


@user_step_decorator
def around(step_name, flow, inputs, attributes):
    flow.log.append(("pre", step_name, attributes.get("tag")))
    try:
        yield
    except KeyError:
        flow.log.append(("caught",))
    flow.log.append(("post", step_name))


@user_step_decorator
def skipper(step_name, flow, inputs):
    yield {"foreach": "items"} if step_name == "fan" else USER_SKIP_STEP


@user_step_decorator
def twice(step_name, flow, inputs):
    yield
    yield


class Marker(UserStepDecorator):
    def pre_step(self, step_name, flow, inputs=None):
        flow.log.append(("marker-pre", step_name))

    def post_step(self, step_name, flow, exception=None):
        flow.log.append(("marker-post", type(exception).__name__ if exception else None))
        return exception, None


class Retries(StepMutator):
    def init(self, times=1):
        self.times = times

    def mutate(self, mutable_step):
        mutable_step.add_decorator(retry, deco_kwargs={"times": self.times})


class AddsParam(FlowMutator):
    def pre_mutate(self, mutable_flow):
        mutable_flow.add_parameter("extra", Parameter("extra", default=3))
        for _, s in mutable_flow.steps:
            s.add_decorator(Retries, deco_args=[2])

    def mutate(self, mutable_flow):
        mutable_flow.start.add_decorator("environment:vars={\"A\": \"1\"}")


@AddsParam
class MutatedFlow(FlowSpec):
    @around(tag="t")
    @Marker
    @step
    def start(self):
        self.next(self.end)

    @Retries(times=4)
    @step
    def end(self):
        pass


def test_attaching_keeps_plain_step_functions():
    assert isinstance(MutatedFlow, AddsParam) and flow_class_of(MutatedFlow) is MutatedFlow._flow_cls
    cls = flow_class_of(MutatedFlow)
    start = vars(cls)["start"]
    assert callable(start) and start.is_step  # not the decorator object a bare `@Marker` returned
    assert [type(w).__name__ for w in start.wrappers] == ["Marker", "around"]  # bottom first, as Metaflow
    assert [type(d).__name__ for d in cls.end.config_decorators] == ["Retries"]
    assert {n.name for n in FlowGraph(cls)} == {"start", "end"}


def test_mutators_run_once_with_the_run_configs():
    cls = flow_class_of(MutatedFlow)
    assert apply_user_decorators(cls, {}) is True
    assert apply_user_decorators(cls, {}) is False  # once per process
    assert "extra" in cls._run_inputs()
    assert [d.attributes["times"] for d in cls.end.decorators if d.name == "retry"] == [4]  # IGNORE: the first
    assert [d.attributes["times"] for d in cls.start.decorators if d.name == "retry"] == [2]
    assert [d.attributes["vars"] for d in cls.start.decorators if d.name == "environment"] == [{"A": "1"}]


class Plain(FlowSpec):
    @step
    def start(self):
        self.next(self.end)

    @retry(times=1)
    @step
    def end(self):
        pass


def _mutable(pre: bool) -> MutableStep:
    return MutableStep(Plain, Plain.end, pre_mutate=pre, statically_defined=True, inserted_by=["test"])


def test_add_and_remove_step_decorators():
    m = _mutable(False)
    assert m.add_decorator(retry, deco_kwargs={"times": 5}) is None  # IGNORE keeps the existing one
    assert m.add_decorator("retry:times=6", duplicates=OVERRIDE).attributes["times"] == 6
    assert [d.attributes["times"] for d in Plain.end.decorators if d.name == "retry"] == [6]
    assert m.has_decorator("retry") and m.get_decorator_specs("retry")[0][3]["times"] == 6
    with pytest.raises(ConfigError, match="twice"):
        m.add_decorator(retry, duplicates=2)
    assert m.add_decorator(environment, deco_kwargs={"vars": {"X": "y"}}, duplicates=IGNORE) is not None
    assert m.remove_decorator("retry", deco_kwargs={"times": 1}) is False  # the arguments must match
    assert m.remove_decorator("environment") is True and not m.has_decorator("environment")
    with pytest.raises(ConfigError, match="pre_mutate"):
        m.add_decorator(Retries)  # a step mutator only in pre_mutate
    with pytest.raises(TypeError):
        m.add_decorator(object())


def test_flow_changes_only_in_pre_mutate():
    late = MutableFlow(Plain, pre_mutate=False, inserted_by=["test"])
    with pytest.raises(ConfigError, match="pre_mutate"):
        late.add_parameter("p", Parameter("p", default=1))
    early = MutableFlow(Plain, pre_mutate=True, inserted_by=["test"])
    with pytest.raises(ConfigError, match="already has a class member"):
        early.add_parameter("start", Parameter("start", default=1))
    early.add_parameter("p", Parameter("p", default=1))
    assert dict(early.parameters)["p"].name == "p" and "p" in Plain._run_input_names()
    assert early.remove_parameter("p") and "p" not in Plain._run_inputs()
    assert sorted(name for name, _ in early.steps) == ["end", "start"]
    with pytest.raises(ConfigError, match="only be created"):
        MutableStep(Plain, Plain.end)


def test_user_step_decorator_checks_its_function():
    with pytest.raises(ConfigError, match="generator"):
        user_step_decorator(lambda a, b, c: None)

    def two(step_name, flow):
        yield

    with pytest.raises(ConfigError, match="3 or 4"):
        user_step_decorator(two)
    with pytest.raises(ConfigError, match="does not allow arguments"):
        Marker(1)
    with pytest.raises(ConfigError, match="step function"):
        around(tag="x")(lambda self: None)


def test_parse_decospec():
    assert parse_decospec('environment:vars={"a": 1},0=2,x=1.5,y=abc') == \
        ("environment", [2], {"vars": {"a": 1}, "x": 1.5, "y": "abc"})
    assert parse_decospec("retry") == ("retry", [], {})


def _ctx(kind="linear", out=("end",), step_name="start", inputs=None):
    flow = SimpleNamespace(log=[], __dict__={})
    calls = []
    flow.next = lambda *steps, **kw: calls.append((steps, kw))
    for name in out:
        setattr(flow, name, name)
    node = SimpleNamespace(out_funcs=list(out), kind=kind, foreach_var="items")
    return SimpleNamespace(flow=flow, spec=SimpleNamespace(step=step_name), inputs=inputs, node=node), calls


def _wrappers(*decos):
    @step
    def f(self):
        pass

    for d in reversed(decos):  # applied bottom first
        d(f)
    return f.wrappers


def test_wrappers_run_outermost_first_and_swallow():
    ctx, calls = _ctx()
    ran = []
    run_wrapped(ctx, _wrappers(around(tag="t"), Marker()), lambda: ran.append(1))
    assert ctx.flow.log == [("pre", "start", "t"), ("marker-pre", "start"), ("marker-post", None),
                            ("post", "start")] and ran == [1] and calls == []

    def fails():
        raise KeyError("k")

    ctx, calls = _ctx()
    run_wrapped(ctx, _wrappers(around(tag=None), Marker()), fails)
    assert ("marker-post", "KeyError") in ctx.flow.log and ("caught",) in ctx.flow.log
    assert calls == [(("end",), {})]  # the exception was swallowed: self.next as the step says


def test_skip_and_errors():
    ctx, calls = _ctx()
    run_wrapped(ctx, _wrappers(skipper()), lambda: pytest.fail("skipped"))
    assert calls == [(("end",), {})]
    ctx, calls = _ctx(kind="foreach", out=("each",), step_name="fan")
    run_wrapped(ctx, _wrappers(skipper()), lambda: pytest.fail("skipped"))
    assert calls == [(("each",), {"foreach": "items"})]
    ctx, _ = _ctx()
    with pytest.raises(ConfigError, match="only yield once"):
        run_wrapped(ctx, _wrappers(twice()), lambda: None)
    ctx, _ = _ctx(kind="parallel", out=("gang",))
    with pytest.raises(StokerError, match="parallel"):
        run_wrapped(ctx, _wrappers(skipper()), lambda: None)
