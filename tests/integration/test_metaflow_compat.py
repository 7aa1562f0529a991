"""Flows written for Metaflow run under stoker after changing only their import line.

Each file in tests/flows/metaflow/ is written as a Metaflow user writes it (`from metaflow import ...`). A test
copies it to a temporary folder, replaces the `from metaflow import` line by `from stoker import` (nothing
else), runs `python flow.py run ...` as a user would, and reads the results back with stoker's client, using
Metaflow's client idioms (`Flow(name).latest_run`, `run[step].task.data.x`, `run.data.x`).

Metaflow itself is not needed; every behaviour asserted here was checked against Metaflow 2.19 once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.compat.engines import FLOWS, to_stoker

pytestmark = pytest.mark.slow


@dataclass
class FlowRun:
    proc: subprocess.CompletedProcess
    home: Path

    @property
    def output(self) -> str:
        return self.proc.stdout + self.proc.stderr


def stoker_copy(name: str, dest: Path) -> Path:
    """Copy a Metaflow flow file, changing only its `from metaflow import` line."""
    src = (FLOWS / name).read_text()
    changed = to_stoker(src)
    assert sum(a != b for a, b in zip(src.splitlines(), changed.splitlines(), strict=True)) == 1, \
        f"{name} must have exactly one metaflow import line"
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / name
    path.write_text(changed)
    return path


def run_flow(name: str, folder: Path, *args: str, top: tuple[str, ...] = ("--no-pylint",), command: str = "run",
             home: Path | None = None, timeout: float = 120) -> FlowRun:
    """`python <name> [top options] COMMAND ARGS` in `folder`, as a user types it; STOKER_HOME from the env or
    `home`."""
    path = stoker_copy(name, folder)
    env = dict(os.environ)
    if home is not None:
        env["STOKER_HOME"] = str(home)
    proc = subprocess.run([sys.executable, path.name, *top, command, *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=timeout)
    return FlowRun(proc, Path(env["STOKER_HOME"]))


def ok(run: FlowRun) -> FlowRun:
    assert run.proc.returncode == 0, run.output[-4000:]
    return run


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """Runs shared by several tests of this module (each flow runs once), keyed by name."""
    cache: dict[str, FlowRun] = {}

    def get(key: str, name: str, *args: str, setup=None) -> FlowRun:
        if key not in cache:
            folder = tmp_path_factory.mktemp(key)
            if setup:
                setup(folder)
            cache[key] = run_flow(name, folder, *args, home=folder / "stoker_home")
        return cache[key]

    return get


def use(run: FlowRun, monkeypatch) -> None:
    """Point the client at the run's STOKER_HOME."""
    monkeypatch.setenv("STOKER_HOME", str(run.home))


# -- parameters, IncludeFile, JSONType, current -------------------------------------------------------------
def _notes(folder: Path) -> None:
    (folder / "notes.txt").write_text("first line\nsecond line\n")


PARAMS_ARGS = ("--alpha", "0.5", "--steps", "4", "--greeting", "hi", "--flag", "true",
               "--hparams", '{"layers": 4, "act": "gelu"}', "--notes", "notes.txt")


def test_parameters_from_the_command_line(shared, monkeypatch):
    from stoker import Flow

    run = ok(shared("params_cli", "params_flow.py", *PARAMS_ARGS, setup=_notes))
    use(run, monkeypatch)
    r = Flow("ParamsFlow").latest_run
    assert r.successful and r.finished
    start = r["start"].task.data
    assert start.types == ["float", "int", "str", "bool", "dict"]
    assert start.product == pytest.approx(2.0)
    assert start.alpha == 0.5 and start.steps == 4 and start.flag is True
    assert start.hparams == {"layers": 4, "act": "gelu"}
    assert r.data.message == "hi x4"  # run.data: the end task's artifacts
    assert r["end"].task.data.notes_lines == ["first line", "second line"]
    assert r["end"].task.data.notes == "first line\nsecond line\n"


def test_parameter_defaults_and_json_default(shared, monkeypatch):
    from stoker import Flow

    run = ok(shared("params_default", "params_flow.py", "--notes", "notes.txt", setup=_notes))
    use(run, monkeypatch)
    d = Flow("ParamsFlow").latest_run["start"].task.data
    assert (d.alpha, d.steps, d.greeting, d.flag) == (0.01, 3, "hello", False)
    assert d.hparams == {"layers": 2, "act": "relu"}  # a JSONType default given as a JSON string
    assert d.types == ["float", "int", "str", "bool", "dict"]


def test_current_attributes(shared, monkeypatch):
    from stoker import Flow

    run = ok(shared("params_cli", "params_flow.py", *PARAMS_ARGS, setup=_notes))
    use(run, monkeypatch)
    r = Flow("ParamsFlow").latest_run
    task = r["start"].task
    info = task.data.info
    assert info["flow_name"] == "ParamsFlow"
    assert info["run_id"] == r.id
    assert info["step_name"] == "start"
    assert str(info["task_id"]) == task.id
    assert info["pathspec"] == f"ParamsFlow/{r.id}/start/{task.id}" == task.pathspec
    assert info["retry_count"] == 0 and info["origin_run_id"] is None
    assert info["is_running_flow"] is True and info["tempdir_exists"] is True
    assert info["username"] == os.environ["USER"] and info["namespace"] == f"user:{os.environ['USER']}"
    assert r["end"].task.data.end_step == "end"


def test_include_file_that_does_not_exist_fails_the_run(tmp_path):
    run = run_flow("params_flow.py", tmp_path, "--notes", "missing.txt")
    assert run.proc.returncode != 0
    assert "missing.txt" in run.output


# -- branches and joins -------------------------------------------------------------------------------------
def test_static_branches_inputs_by_name_and_merge_artifacts(tmp_path):
    from stoker import Flow

    # Metaflow's global options before `run` are accepted (and mean the local defaults here).
    ok(run_flow("branch_flow.py", tmp_path, top=("--no-pylint", "--datastore=local", "--metadata", "local")))
    r = Flow("BranchFlow").latest_run
    assert r.successful
    join = r["join"].task.data
    assert join.xs == [1, 2]
    assert join.common == "shared" and join.only_a == "A"
    assert "x" not in r["join"].task  # excluded from the merge and not assigned
    assert r["join2"].task.data.best == 20 and r["join2"].task.data.label == "same"
    assert "score" not in r["join2"].task
    assert r.data.summary == "shared:[1, 2]:20:same"
    assert {s.id for s in r} >= {"start", "a", "b", "join", "c", "d", "join2", "end"}


def test_foreach_input_index_and_client_tasks(tmp_path):
    from stoker import Flow, Run

    ok(run_flow("foreach_flow.py", tmp_path, "--tag", "exp1"))
    flow = Flow("WordsFlow")
    r = flow.latest_successful_run
    assert r == flow.latest_run
    assert "exp1" in r.tags and "exp1" in r.user_tags
    assert [x.id for x in flow.runs("exp1")] == [r.id]
    words = ["a", "bb", "ccc", "dddd", "eeeee"]
    assert r["join"].task.data.lengths == [1, 2, 3, 4, 5]
    assert r["join"].task.data.positions == [0, 1, 2, 3, 4]
    assert r.data.total == 15
    tasks = list(r["measure"])
    assert len(tasks) == 5
    for t in tasks:
        assert t.index == t.data.position
        assert t.data.word == words[t.index]
        assert t.successful
    assert Run(r.pathspec)["end"].task.data.words == words


def test_nested_foreach_and_foreach_stack(tmp_path):
    from stoker import Flow

    ok(run_flow("nested_foreach_flow.py", tmp_path))
    r = Flow("GridFlow").latest_run
    assert r["outer_join"].task.data.grid == {
        "small": ["small@0.1", "small@0.01", "small@0.001"],
        "large": ["large@0.1", "large@0.01", "large@0.001"],
    }
    assert r.data.count == 6
    stacks = sorted(t.data.stack for t in r["train"])
    assert len(stacks) == 6
    assert stacks[0] == [(0, 2, "small"), (0, 3, 0.1)]
    assert stacks[-1] == [(1, 2, "large"), (2, 3, 0.001)]
    assert len(list(r["inner_join"])) == 2


# -- decorators ---------------------------------------------------------------------------------------------
def test_retry_catch_timeout_resources_environment(shared, monkeypatch):
    from stoker import Flow

    run = ok(shared("decorators", "decorators_flow.py"))
    use(run, monkeypatch)
    r = Flow("DecoratorsFlow").latest_run
    assert r.successful
    flaky = r["flaky"].task
    assert flaky.data.attempt == 1 and flaky.current_attempt == 1
    hangs = r["hangs_once"].task  # @timeout fired on the first attempt, @retry ran it again
    assert hangs.data.hang_attempt == 1 and hangs.current_attempt == 1
    failure = r["failing"].task.data.failure
    assert failure.type == "builtins.ValueError" and "boom" in failure.exception
    assert "timed out" in str(r["slow"].task.data.timeout_failure.exception)
    assert r["fine"].task.data.env_value == "from-environment"
    assert r.data.saw_failure is True and r.data.saw_timeout is True


def test_catch_var_is_none_when_the_step_succeeds(shared, monkeypatch):
    from stoker import Flow

    run = ok(shared("decorators", "decorators_flow.py"))
    use(run, monkeypatch)
    assert Flow("DecoratorsFlow").latest_run["fine"].task.data.no_failure is None


def test_caught_exception_fields_match_metaflow(shared, monkeypatch):
    from stoker import Flow

    run = ok(shared("decorators", "decorators_flow.py"))
    use(run, monkeypatch)
    failure = Flow("DecoratorsFlow").latest_run["failing"].task.data.failure
    assert failure.exception == "boom"
    assert "ValueError: boom" in failure.stacktrace


# -- Config -------------------------------------------------------------------------------------------------
def _cfg(folder: Path) -> None:
    (folder / "cfg.json").write_text('{"lr": 0.003, "model": {"name": "tiny", "layers": 2}}')
    (folder / "other.json").write_text('{"lr": 0.1, "model": {"name": "big", "layers": 8}}')


def test_config_default_file(tmp_path):
    from stoker import Flow

    _cfg(tmp_path)
    ok(run_flow("config_flow.py", tmp_path))
    r = Flow("ConfigFlow").latest_run
    assert r["start"].task.data.lr == 0.003 and r["start"].task.data.layers == 2
    assert r.data.summary == "tiny:2:0.003"


def test_config_file_from_metaflow_command_line(tmp_path):
    from stoker import Flow

    _cfg(tmp_path)
    ok(run_flow("config_flow.py", tmp_path, top=("--no-pylint", "--config", "cfg", "other.json")))
    assert Flow("ConfigFlow").latest_run.data.summary == "big:8:0.1"


# -- command-line names -------------------------------------------------------------------------------------
def test_underscore_parameter_option(tmp_path):
    from stoker import Flow

    ok(run_flow("cli_names_flow.py", tmp_path, "--num_items", "5"))
    assert Flow("CliNamesFlow").latest_run["start"].task.data.doubled == 10


def test_parameter_separator(tmp_path):
    from stoker import Flow

    ok(run_flow("cli_names_flow.py", tmp_path, "--names", "a,b,c"))
    assert Flow("CliNamesFlow").latest_run["start"].task.data.name_list == ["a", "b", "c"]


def test_callable_parameter_default_gets_a_context(tmp_path):
    from stoker import Flow

    ok(run_flow("deploy_time_flow.py", tmp_path))
    assert Flow("DeployTimeFlow").latest_run["start"].task.data.described == "DeployTimeFlow-label:7"


# -- resume -------------------------------------------------------------------------------------------------
def _failed_run(folder: Path) -> str:
    run = run_flow("resume_flow.py", folder, "--run-id-file", "run_id.txt")
    assert run.proc.returncode != 0 and "fixed.txt is missing" in run.output
    (folder / "fixed.txt").write_text("ok")
    return (folder / "run_id.txt").read_text().strip()


def test_resume_with_origin_run_id(tmp_path):
    from stoker import Flow, Run

    first = _failed_run(tmp_path)
    assert not Run(f"ResumeFlow/{first}").successful
    ok(run_flow("resume_flow.py", tmp_path, "--origin-run-id", first, command="resume"))
    r = Flow("ResumeFlow").latest_run
    assert r.successful and r.id != first
    assert r["start"].task.data.started_in == first  # cloned, not rerun
    assert r["middle"].task.data.middle_run == r.id
    assert r.data.origin == first  # current.origin_run_id


def test_resume_from_a_step_metaflow_syntax(tmp_path):
    from stoker import Flow

    first = _failed_run(tmp_path)
    ok(run_flow("resume_flow.py", tmp_path, "start", command="resume"))
    r = Flow("ResumeFlow").latest_run
    assert r.successful and r["start"].task.data.started_in == r.id  # start was rerun, not cloned
    assert r.data.origin == first
