"""No command line ends in a traceback (issue 27).

Every `stoker` subcommand and every `python flow.py` command (read from their parsers, so a new one is covered
without editing this file) and every `python -m stoker.*` entry point (found by their `__main__` guards), given bad
arguments, exits non-zero with either one `error:` line (stoker's errors) or argparse's usage and its one
`PROG: error:` line (exit 2), and never prints "Traceback". Values out of their range are refused before any work
starts (the CASES table); output cut off by its reader (`stoker runs | head -1`) ends quietly with 141.

The table's rows run as real processes, a few at a time; the generic rows of `stoker` and `python flow.py`
subcommands (an unknown option: argparse's work alone) run in this process.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import sqlite3
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from stoker.cli import flow_cli
from stoker.cli.main import build_parser, main
from stoker.recipes.llama_pretrain import LlamaPretrain
from tests.helpers import ROOT

SRC = ROOT / "src"
STOKER = "stoker.cli.main"  # what the `stoker` script runs (pyproject: stoker = "stoker.cli.main:main")
FLOW = "stoker.recipes.llama_pretrain"  # a flow run as `python -m`: `python flow.py COMMAND ...`
BAD = "--no-such-option"


@dataclass(frozen=True)
class Case:
    """One command line: `argv` after `python -m` ("{tmp}" is the row's own scratch folder, also its cwd and
    $STOKER_HOME's parent), the exit code expected (None: any non-zero), a piece of the error line, and what
    the row's folder holds first (`home`: "empty", "corrupt" index, "sound" index; a row naming {tmp}/afile gets
    that file)."""

    argv: tuple[str, ...]
    code: int | None
    text: str = ""
    home: str = "empty"
    env: tuple[tuple[str, str], ...] = ()


def S(*args: str, code: int | None = 1, text: str = "", **kw) -> Case:
    return Case((STOKER, *args), code, text, **kw)


def M(module: str, *args: str, code: int | None = 1, text: str = "", **kw) -> Case:
    return Case((module, *args), code, text, **kw)


USAGE = 2  # argparse: usage + `PROG: error: ...`
CASES: dict[str, Case] = {
    # stoker runs / show / logs / kill
    "runs --limit -1": S("runs", "--limit", "-1", code=USAGE, text="--limit: must be a whole number >= 1, got -1"),
    "runs --limit 0": S("runs", "--limit", "0", code=USAGE, text="must be a whole number >= 1, got 0"),
    "runs on a corrupt index": S("runs", home="corrupt", text="damaged (corrupt)"),
    "runs, STOKER_USER with a newline": S("runs", env=(("STOKER_USER", "eve\nmallory"),),
                                          text="$STOKER_USER='eve\\nmallory' holds a control character"),
    "show FLOW only": S("show", "OnlyAFlow", text="give FLOW/RUN"),
    "logs --attempt -1": S("logs", "F/1/start", "--attempt", "-1", code=USAGE, text="whole number >= 0"),
    "logs a bad pathspec": S("logs", "nothing", text="give FLOW/RUN/STEP"),
    "kill a bad pathspec": S("kill", "nothing", text="give FLOW/RUN"),
    "stacks a bad pathspec": S("stacks", "nothing", text="give FLOW/RUN, FLOW/RUN/STEP or FLOW/RUN/STEP/TASK"),
    "stacks --wait 0": S("stacks", "F/1", "--wait", "0", code=USAGE, text="must be a finite number >= 0.5"),
    "logs --stacks of a run": S("logs", "F/1", "--stacks", text="give FLOW/RUN/STEP or FLOW/RUN/STEP/TASK"),
    "goodput of no such run": S("goodput", "NoFlow/1", text="does not exist"),
    # stoker quickstart: the pipeline's settings, checked when the run starts (before data is prepared)
    "quickstart cluster.nodes=-1": S("quickstart", "--set", "cluster.nodes=-1",
                                     text="cluster.nodes=-1 is out of range: it must be a whole number >= 1"),
    "quickstart cluster.nproc_per_node=0": S("quickstart", "--set", "cluster.nproc_per_node=0",
                                             text="cluster.nproc_per_node=0 is out of range"),
    "quickstart train.steps=1e400": S("quickstart", "--set", "train.steps=1e400",
                                      text="train.steps=inf: expected an integer"),
    "quickstart train.lr=1e400": S("quickstart", "--set", "train.lr=1e400", text="train.lr must be a finite number"),
    "quickstart evaluate.batches=0": S("quickstart", "--set", "evaluate.batches=0",
                                       text="evaluate.batches=0 is out of range"),
    "quickstart data.val_fraction=0": S("quickstart", "--set", "data.val_fraction=0",
                                        text="the evaluate step needs a validation split"),
    "quickstart cluster.node (misspelt)": S("quickstart", "--set", "cluster.node=2",
                                            text="did you mean cluster.nodes?"),
    "quickstart an unknown option": S("quickstart", BAD, code=USAGE, text="unrecognized arguments"),
    # stoker data
    "data prepare --block-size 1": S("data", "prepare", "--block-size", "1", text="block_size=1"),
    "data train-tokenizer --max-docs 0": S("data", "train-tokenizer", "--max-docs", "0", code=USAGE),
    # stoker image / infra (no AWS reached)
    "image render --kind bogus": S("image", "render", "--kind", "bogus", code=USAGE, text="invalid choice"),
    "image build, no such flow": S("image", "build", "--dry-run", "{tmp}/nope.py", text="no such file"),
    "infra init into a missing folder": S("infra", "init", "--config", "{tmp}/no/dir/x.toml", text="cannot write"),
    "infra plan, no config": S("infra", "plan", "--config", "{tmp}/none.toml", text="no infra config"),
    "infra apply --timeout 0": S("infra", "apply", "--timeout", "0", code=USAGE, text="must be a finite number"),
    "infra destroy, no config": S("infra", "destroy", "--config", "{tmp}/none.toml", text="no infra config"),
    "infra status, no config": S("infra", "status", "--config", "{tmp}/none.toml", text="no infra config"),
    # stoker card / report / ui / reindex
    "card view --attempt -1": S("card", "view", "F/1/s", "--attempt", "-1", code=USAGE),
    "card view a bad pathspec": S("card", "view", "F", text="give FLOW/RUN/STEP"),
    "card list a bad pathspec": S("card", "list", "F", text="give FLOW/RUN/STEP"),
    "report a bad pathspec": S("report", "F", text="give FLOW/RUN"),
    "ui --port 99999": S("ui", "--port", "99999", code=USAGE, text="must be a port number (1-65535), got 99999"),
    "ui --port -1": S("ui", "--port", "-1", code=USAGE, text="must be a port number (1-65535), got -1"),
    "ui --port 0": S("ui", "--port", "0", code=USAGE, text="got 0"),
    "reindex a sound index": S("reindex", home="sound", text="nothing to repair"),
    # python flow.py (the quickstart flow as `python -m`): refused before a run is created
    "run --max-workers 0": M(FLOW, "run", "--max-workers", "0", code=USAGE, text="must be a whole number >= 1"),
    "run --max-workers -3": M(FLOW, "run", "--max-workers", "-3", code=USAGE, text="got -3"),
    "run --hang-timeout -1": M(FLOW, "run", "--hang-timeout", "-1", code=USAGE, text="must be a finite number >= 0"),
    "run --tag user:mallory": M(FLOW, "run", "--tag", "user:mallory", text="'user:' are system tags"),
    "run --tag project:other": M(FLOW, "run", "--tag", "project:other", text="'project:' are system tags"),
    "run --tag with a newline": M(FLOW, "run", "--tag", "a\nb", text="control character ('\\n')"),
    "run, STOKER_USER with a tab": M(FLOW, "run", env=(("STOKER_USER", "eve\tx"),), text="control character"),
    "run --config missing": M(FLOW, "run", "--config", "{tmp}/none.toml", text="no such file"),
    "resume --max-workers 0": M(FLOW, "resume", "--max-workers", "0", code=USAGE),
    "check an unknown option": M(FLOW, "check", BAD, code=USAGE),
    "show an unknown option": M(FLOW, "show", BAD, code=USAGE),
    "logs (flow) a bad pathspec": M(FLOW, "logs", "x"),
    "dump, no such run": M(FLOW, "dump", "999/start"),
    "tag add, no run": M(FLOW, "tag", "add", "--run-id", "1", "x", text="No run found"),
    "tag remove, no run": M(FLOW, "tag", "remove", "--run-id", "1", "x", text="No run found"),
    "tag replace without --add": M(FLOW, "tag", "replace", "--run-id", "1", "--remove", "x",
                                   text="Specify at least one tag to add"),
    "tag list --all --my-runs": M(FLOW, "tag", "list", "--all", "--my-runs", text="cannot be used together"),
    "_task without a spec file": M(FLOW, "_task", "{tmp}/none.json", text="task spec file"),
    # python -m entry points
    "stoker.data prepare --block-size 1": M("stoker.data", "prepare", "--block-size", "1", text="block_size=1"),
    "stoker.train --steps 0": M("stoker.train", "--steps", "0", code=78, text="train.steps must be >= 1"),
    "stoker.train train.beta1=1": M("stoker.train", "--set", "train.beta1=1", code=78, text="train.beta1"),
    "stoker.train.hf OUT is a file": M("stoker.train.hf", "{tmp}/ck", "{tmp}/afile",
                                       text="is a file, not a folder"),
    "stoker.train.hf OUT under a file": M("stoker.train.hf", "{tmp}/ck", "{tmp}/afile/out",
                                          text="cannot create the folder"),
    "stoker.train.evaluate --batches 0": M("stoker.train.evaluate", "{tmp}/ck", "--data", "{tmp}/d", "--batches",
                                           "0", text="evaluate: batches=0: must be a whole number >= 1"),
    "stoker.train.collectives without torchrun": M("stoker.train.collectives", code=2, text="runs under torchrun"),
    "stoker.train.collectives --sizes x": M("stoker.train.collectives", "--sizes", "x", code=USAGE),
    "stoker._process --reap x": M("stoker._process", "--reap", "x", text="--reap GRACE_SECONDS"),
    "stoker.distributed.zygote, no socket": M("stoker.distributed.zygote", "7", code=USAGE,
                                              text="the launcher starts it"),
    "stoker.cli.guardian, no run": M("stoker.cli.guardian", code=USAGE, text="required"),
    "stoker.features.run_exit_hook, no args": M("stoker.features.run_exit_hook", text="FLOW_FILE FUNCTION FLOW/RUN_ID"),
    "stoker.cli.main --limit x": M("stoker.cli.main", "runs", "--limit", "x", code=USAGE),
    "stoker.runtime.node, a bad spec": M("stoker.runtime.node", "--store", "{tmp}/s", "--code", "x", "--spec", "y",
                                         text="not a blob key"),
    "stoker.runtime.member.node, no args": M("stoker.runtime.member.node", code=USAGE, text="required"),
    "stoker.backends.slurm.node, a bad spec": M("stoker.backends.slurm.node", "--store", "{tmp}/s", "--code", "x",
                                                "--spec", "y", text="not a blob key"),
    "stoker.backends.aws.node, a bad spec": M("stoker.backends.aws.node", "--store", "{tmp}/s", "--code", "x",
                                              "--spec", "y", text="not a blob key"),
}
FILE_ROWS = {k for k in CASES if "afile" in " ".join(CASES[k].argv)}


def error_shape(stderr: str) -> str | None:
    """None when stderr is one error line, or argparse's usage followed by its one `PROG: error:` line."""
    if "Traceback" in stderr:
        return "a traceback"
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    if not lines:
        return "nothing on stderr"
    if len(lines) == 1:
        return None if "error:" in lines[0] else f"one line without 'error:': {lines[0]!r}"
    if lines[0].startswith("usage:") and re.match(r"^\S.*: error: ", lines[-1]) \
            and all(ln.startswith(" ") for ln in lines[1:-1]):
        return None
    return f"{len(lines)} lines, not one error line nor usage + error: {lines[:4]}"


def leaf_commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path of `parser` (`("data", "prepare")`, ...), hidden ones included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return [leaf for name, sub in action.choices.items() for leaf in leaf_commands(sub, (*prefix, name))]
    return [prefix]


def entry_points() -> list[str]:
    """Every module that `python -m` runs: packages with a __main__.py, modules with a __main__ guard."""
    out = []
    for f in sorted((SRC / "stoker").rglob("*.py")):
        parts = f.relative_to(SRC).with_suffix("").parts
        if f.name == "__main__.py":
            out.append(".".join(parts[:-1]))
        elif re.search(r"^if __name__ == ['\"]__main__['\"]:", f.read_text(), re.M):
            out.append(".".join(parts))
    return out


def prepare(tmp: Path, case: Case, name: str) -> dict[str, str]:
    home = tmp / "home"
    home.mkdir(parents=True)
    if case.home == "corrupt":
        (home / "metadata.db").write_bytes(b"this is not an SQLite file\n" * 100)
    elif case.home == "sound":
        sqlite3.connect(home / "metadata.db").execute("CREATE TABLE t (x)").connection.close()
    if name in FILE_ROWS:
        (tmp / "afile").write_text("a file\n")
    env = {**os.environ, "STOKER_HOME": str(home), "COLUMNS": "100", **dict(case.env)}
    env.pop("STOKER_DEBUG", None)
    return env


def run_case(name: str, case: Case, root: Path) -> subprocess.CompletedProcess:
    tmp = root / re.sub(r"\W+", "_", name)
    env = prepare(tmp, case, name)
    argv = [a.replace("{tmp}", str(tmp)) for a in case.argv]
    return subprocess.run([sys.executable, "-m", *argv], cwd=tmp, env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=240)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Every row of CASES, run as real processes, three at a time (the torch-importing ones take seconds)."""
    root = tmp_path_factory.mktemp("command-lines")
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {name: pool.submit(run_case, name, case, root) for name, case in CASES.items()}
        return {name: f.result() for name, f in futures.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_command_line_is_one_error_line(name, results):
    case, p = CASES[name], results[name]
    shown = f"python -m {' '.join(case.argv)}\nexit {p.returncode}\nstdout: {p.stdout[-800:]}\nstderr: {p.stderr}"
    assert p.returncode != 0, shown
    if case.code is not None:
        assert p.returncode == case.code, shown
    assert error_shape(p.stderr) is None, f"{error_shape(p.stderr)}\n{shown}"
    assert "Traceback" not in p.stdout, shown
    assert case.text in p.stderr, shown


def test_every_command_and_entry_point_has_a_row():
    """A new subcommand or `python -m` module needs its row of bad arguments in CASES."""
    rows = [c.argv for c in CASES.values()]
    stoker = [c for c in leaf_commands(build_parser()) if not any(r[0] == STOKER and r[1:1 + len(c)] == c
                                                                  for r in rows)]
    flow = [c for c in leaf_commands(flow_cli.build_parser(LlamaPretrain))
            if not any(r[0] == FLOW and r[1:1 + len(c)] == c for r in rows)]
    modules = [m for m in entry_points() if not any(r[0] == m for r in rows)]
    assert not stoker and not flow and not modules, \
        f"add rows to CASES for: stoker {stoker}, python flow.py {flow}, python -m {modules}"


def _in_process(fn, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        fn()
    code = e.value.code
    err = capsys.readouterr().err
    if isinstance(code, str):  # sys.exit("message"): printed by the interpreter as it exits
        return 1, err + code + "\n"
    return code or 0, err


@pytest.mark.parametrize("command", [c for c in leaf_commands(build_parser()) if c != ("quickstart",)],
                         ids=" ".join)
def test_every_stoker_subcommand_refuses_an_unknown_option(command, capsys):
    code, err = _in_process(lambda: main([*command, BAD]), capsys)  # quickstart passes it on: a row above
    assert code == USAGE and error_shape(err) is None and re.search(r"unrecognized arguments|required", err), err


@pytest.mark.parametrize("command", leaf_commands(flow_cli.build_parser(LlamaPretrain)), ids=" ".join)
def test_every_flow_command_refuses_an_unknown_option(command, capsys):
    code, err = _in_process(lambda: flow_cli.main(LlamaPretrain, [*command, BAD]), capsys)
    assert code != 0 and error_shape(err) is None, err


def _many_runs(home: Path, n: int) -> None:
    from stoker.store.metadata import MetadataDB

    with MetadataDB(home / "metadata.db") as db:
        for i in range(n):
            db.create_run("PipeFlow", str(i + 1), user="tester", tags=[f"t{i}"], params={}, created_at=1e9 + i)


@pytest.fixture(scope="module")
def many_runs(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("pipe-home")
    _many_runs(home, 1500)  # `stoker runs` prints ~120 KB, more than a pipe holds (64 KiB)
    return home


@pytest.mark.parametrize("args", [("runs", "--all", "--limit", "2000"), ("runs", "--all", "--limit", "2000", "--json")],
                         ids=" ".join)
def test_output_cut_off_by_its_reader_ends_quietly(args, many_runs, tmp_path):
    """`stoker runs | head -1`: a real pipe whose reader goes away after one line (the output is larger than a
    pipe's buffer, so the writer meets the closed pipe): exit 141, nothing on stderr."""
    env = {**os.environ, "STOKER_HOME": str(many_runs)}
    p = subprocess.Popen([sys.executable, "-m", STOKER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env, cwd=tmp_path)
    first = p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 141 and first and err == "", err


def test_ui_refuses_a_port_in_use(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        p = subprocess.run([sys.executable, "-m", STOKER, "ui", "--port", str(port)], capture_output=True,
                           text=True, env={**os.environ, "STOKER_HOME": str(tmp_path)}, timeout=60)
    assert p.returncode == 1 and error_shape(p.stderr) is None and f"--port {port}: cannot listen" in p.stderr
    assert "stoker ui: http" not in p.stdout  # refused before the URL (and a token) is printed
