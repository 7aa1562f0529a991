"""`run --dry-run` makes every check the run makes before submitting (issue 34 item 4): what the run would refuse
(a step's plan_problem hook, a backend's `check`, e.g. a gang larger than Batch's queue can hold) the dry run
refuses with the same message, instead of printing a request the run never sends."""

from __future__ import annotations

import pytest

from stoker import FlowSpec, Parameter, presubmit, step, torchrun
from stoker.errors import ConfigError
from stoker.runtime.contract import Capabilities, Request, Unit
from stoker.runtime.driver.launch import dry_run


class GangFlow(FlowSpec):
    nodes = Parameter("nodes", default=2, type=int)

    @step
    def start(self):
        self.next(self.train, num_parallel=self.nodes)

    @torchrun
    @step
    def train(self):
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


class SparesFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train, num_parallel=2)

    @torchrun(spares=1, max_restarts=2)
    @step
    def train(self):
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


class CheckingBackend:
    """A remote engine whose queue holds gangs of at most 2 nodes."""

    name, remote, arrays = "engine", True, False

    def __init__(self) -> None:
        self.checked: list[str] = []

    def capabilities(self) -> Capabilities:
        return Capabilities(cpus=64, memory_mb=1 << 20)

    def check(self, unit: Unit) -> None:
        self.checked.append(unit.step)
        if unit.size > 2:
            raise ConfigError(f"step {unit.step!r}: a gang of {unit.size} nodes does not fit the queue (2 at most)")

    def materialize(self, unit: Unit) -> Request:
        return Request(self.name, unit, f"SubmitJob {unit.step} x{unit.size}\n")


def test_a_dry_run_refuses_what_the_backend_would_refuse():
    backend = CheckingBackend()
    assert "SubmitJob train x2" in dry_run(GangFlow, lambda s: backend, values={"nodes": "2"}, config_paths={})
    assert "train" in backend.checked, "the backend's pre-submit check ran"
    with pytest.raises(ConfigError, match="a gang of 3 nodes does not fit the queue"):
        dry_run(GangFlow, lambda s: backend, values={"nodes": "3"}, config_paths={})


def test_a_dry_run_refuses_what_a_steps_plan_problem_names():
    with pytest.raises(ConfigError, match=r"step train: @torchrun\(spares=1, max_restarts=2\)"):
        dry_run(SparesFlow, lambda s: CheckingBackend(), config_paths={})


class PlannedFlow(FlowSpec):
    """A flow whose own plan check (a @presubmit method) refuses a gang of 3 with a global batch of 8."""

    nodes = Parameter("nodes", default=2, type=int)
    global_batch = Parameter("global_batch", default=8, type=int)

    def ranks(self, nodes: int) -> int:
        return nodes * 2

    @presubmit
    def plan(self):
        if self.global_batch % self.ranks(self.nodes):
            raise ConfigError(f"global batch {self.global_batch} is not divisible by {self.ranks(self.nodes)} ranks")

    @step
    def start(self):
        self.next(self.train, num_parallel=self.nodes)

    @torchrun
    @step
    def train(self):
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


def test_a_dry_run_refuses_what_the_flows_presubmit_check_refuses():
    backend = CheckingBackend()
    assert "SubmitJob train x2" in dry_run(PlannedFlow, lambda s: backend, values={"nodes": "2"}, config_paths={})
    with pytest.raises(ConfigError, match="global batch 6 is not divisible by 4 ranks"):
        dry_run(PlannedFlow, lambda s: backend, values={"nodes": "2", "global_batch": "6"}, config_paths={})


def test_a_presubmit_check_sees_inputs_not_artifacts():
    from stoker.flow.presubmit import RunInputs

    view = RunInputs(PlannedFlow, {"nodes": 3, "global_batch": 8})
    assert view.nodes == 3 and view.ranks(view.nodes) == 6
    with pytest.raises(AttributeError, match="sets no artifacts"):
        view.x = 1


PLANNED = '''
from stoker import FlowSpec, Parameter, presubmit, step
from stoker.errors import ConfigError

class PlannedRunFlow(FlowSpec):
    global_batch = Parameter("global_batch", default=8, type=int)

    @presubmit
    def plan(self):
        if self.global_batch % 4:
            raise ConfigError(f"global batch {self.global_batch} is not divisible by 4 ranks")

    @step
    def start(self):
        print("start ran")
        self.next(self.end)

    @step
    def end(self):
        pass

if __name__ == "__main__":
    PlannedRunFlow()
'''


def test_the_run_refuses_before_anything_is_registered(tmp_path):
    import subprocess
    import sys

    (tmp_path / "planned.py").write_text(PLANNED)
    p = subprocess.run([sys.executable, "planned.py", "run", "--global_batch", "6"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "error: global batch 6 is not divisible by 4 ranks" in p.stderr, p.stderr
    assert "start ran" not in p.stdout and "started" not in p.stdout
    ok = subprocess.run([sys.executable, "planned.py", "run"], cwd=tmp_path, capture_output=True, text=True,
                        timeout=120)
    assert ok.returncode == 0 and "start ran" in ok.stdout, ok.stderr
