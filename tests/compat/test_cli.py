"""CLI: `dump` of a task's or a step's artifacts, `tag add|remove|replace|list`, and \
`logs RUN/STEP --stdout|--stderr`."""

from __future__ import annotations

import pickle

import pytest

from tests.compat.conftest import compare
from tests.compat.engines import run_flow

pytestmark = pytest.mark.slow

FLOW = "client_api_flow.py"


def _run_ids(runs):
    return {n: r.client('from metaflow import Flow\nresult = Flow("ClientApiFlow").latest_run.id')
            for n, r in runs.items()}


def _lines(text):
    """Output lines, less Metaflow's own `name` artifact (the flow's name, which stoker does not store)."""
    return [ln for ln in text.splitlines() if ln and not ln.startswith("name [")]


def test_dump_step_and_task(both, request):
    """`dump RUN/STEP` prints every task's artifacts as `name [size: N type: <class 'T'>] = value`."""
    runs = both(FLOW)
    ids = _run_ids(runs)
    got = {}
    for n, r in runs.items():
        step = run_flow(r.engine, FLOW, r.folder, f"{ids[n]}/fan", command="dump", home=r.home).proc
        task = run_flow(r.engine, FLOW, r.folder, f"{ids[n]}/start/1", "--include", "items", "--max-value-size",
                        "0", command="dump", home=r.home).proc
        got[n] = {"step": sorted(_lines(step.stdout)), "step_rc": step.returncode, "task": _lines(task.stdout),
                  "header": "step=fan task_id=" in step.stderr, "bad": run_flow(
                      r.engine, FLOW, r.folder, "a/b/c/d", command="dump", home=r.home).proc.returncode != 0}
    compare(request, "dump output", got, {
        "step": ["items [size: 20 type: <class 'list'>] = [1, 2]", "items [size: 20 type: <class 'list'>] = [1, 2]",
                 "x [size: 5 type: <class 'int'>] = 10", "x [size: 5 type: <class 'int'>] = 20"],
        "step_rc": 0, "task": ["items [size: 20 type: <class 'list'>] = < artifact too large >"], "header": True,
        "bad": True})


def test_dump_file(both, request):
    """`dump RUN/STEP --file F` pickles {"run/step/task": {artifact: value}}."""
    runs = both(FLOW)
    ids = _run_ids(runs)
    got = {}
    for n, r in runs.items():
        proc = run_flow(r.engine, FLOW, r.folder, f"{ids[n]}/gather", "--file", "out.pkl", command="dump",
                        home=r.home).proc
        with open(r.folder / "out.pkl", "rb") as f:
            data = pickle.load(f)
        got[n] = {"rc": proc.returncode, "keys": [k.split("/", 1)[1] for k in data],
                  "values": {k: v for d in data.values() for k, v in d.items() if k != "name"}}
    compare(request, "pickled artifacts", got, {"rc": 0, "keys": ["gather/4"], "values": {"xs": [10, 20]}})


def test_logs_streams(both, request):
    """`logs RUN/STEP` prints stdout then stderr; `--stdout` and `--stderr` print only one."""
    runs = both(FLOW)
    ids = _run_ids(runs)
    got = {}
    for n, r in runs.items():
        procs = {opt: run_flow(r.engine, FLOW, r.folder, f"{ids[n]}/start", *([opt] if opt else []), command="logs",
                               home=r.home).proc for opt in ("", "--stdout", "--stderr")}
        task = run_flow(r.engine, FLOW, r.folder, f"{ids[n]}/end/9", "--stdout", command="logs", home=r.home).proc
        got[n] = {opt or "both": [p.returncode, p.stdout.splitlines()] for opt, p in procs.items()}
        got[n]["task"] = task.stdout.splitlines()
        got[n]["bad"] = run_flow(r.engine, FLOW, r.folder, "nostep", command="logs", home=r.home).proc.returncode != 0
    compare(request, "log lines per option", got, {
        "both": [0, ["hello from start", "warning from start"]], "--stdout": [0, ["hello from start"]],
        "--stderr": [0, ["warning from start"]], "task": ["the end"], "bad": True})


def test_tag_commands(both, request):
    """`tag add|replace|remove|list` change and show a run's user tags; system tags cannot be removed."""
    runs = both(FLOW)
    ids = _run_ids(runs)
    got = {}
    for n, r in runs.items():
        rid = ids[n]

        def tag(*args, r=r):
            return run_flow(r.engine, FLOW, r.folder, *args, command="tag", home=r.home).proc

        def flat(rid=rid, tag=tag):
            p = tag("list", "--flat", rid)
            return sorted(t for t in p.stdout.splitlines() + p.stderr.splitlines()
                          if t in {"one", "two", "three", "user:tester"})

        steps = {"add": tag("add", "--run-id", rid, "one", "two").returncode, "after_add": flat(),
                 "replace": tag("replace", "--run-id", rid, "--remove", "one", "--add", "three").returncode,
                 "after_replace": flat(), "remove": tag("remove", "--run-id", rid, "two").returncode,
                 "after_remove": flat()}
        no_run = tag("add", "one")
        system = tag("remove", "--run-id", rid, "user:tester")
        one_sided = tag("replace", "--run-id", rid, "--add", "x")
        listing = tag("list", "--run-id", rid)
        quiet = run_flow(r.engine, FLOW, r.folder, "list", "--run-id", rid, command="tag", home=r.home,
                         top=("--no-pylint", "--quiet")).proc
        quiet = (quiet.stdout + quiet.stderr).strip().splitlines()[-1].split(" ; ") + ["", ""]  # Metaflow: stderr
        got[n] = {**steps, "no_run_id": [no_run.returncode != 0, "--run-id" in no_run.stdout + no_run.stderr],
                  "system": [system.returncode != 0, "system tag" in system.stdout + system.stderr],
                  "one_sided": one_sided.returncode != 0, "list_rc": listing.returncode,
                  "list_shows": "three" in listing.stdout and "System tags and tags" in listing.stdout,
                  "quiet": [quiet[0] == f"ClientApiFlow/{rid}", "user:tester" in quiet[1].split(","), quiet[2].strip()]}
    compare(request, "tag commands", got, {
        "add": 0, "after_add": ["one", "two", "user:tester"], "replace": 0,
        "after_replace": ["three", "two", "user:tester"],
        "remove": 0, "after_remove": ["three", "user:tester"], "no_run_id": [True, True], "system": [True, True],
        "one_sided": True, "list_rc": 0, "list_shows": True, "quiet": [True, True, "three"]})
