"""A straggler named end to end: tests/flows/straggler_flow.py trains the tiny model in a real @torchrun gang (1 node x
2 ranks, gloo) with rank 1 slowed by the test hook; `stoker show` (text and --json) prints the trainer's line under the
train task, and the UI's run page lists it next to the training metrics, in a real headless browser."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import run_flow
from tests.integration.test_ui_browser import _wait, browser, shots, ui_server  # noqa: F401  (fixtures)
from tests.unit.train.test_parallel import token_file

pytestmark = pytest.mark.slow


def test_show_and_the_ui_name_the_slowed_rank(browser, ui_server, shots, tmp_path):  # noqa: F811
    data = token_file(tmp_path / "tokens.bin")
    run_flow("straggler_flow.py", "run", "--data", str(data), cwd=tmp_path, timeout=300,
             env={"STOKER_TEST_SLOW_RANK": "1:0.2", "STOKER_METRICS_INTERVAL": "0.2", "STOKER_STORE": ""})
    from stoker import Flow

    run = Flow("StragglerFlow").latest_run
    train = run["train"].task
    cli = [sys.executable, "-m", "stoker.cli.main", "show"]
    env = {**os.environ, "COLUMNS": "200"}
    shown = json.loads(subprocess.run([*cli, "--json", run.pathspec], capture_output=True, text=True, timeout=120,
                                      env=env, check=True).stdout)
    tasks = {(s["name"], t["id"]): t for s in shown["steps"] for t in s["tasks"]}
    [line] = tasks[("train", train.id)]["stragglers"]
    assert line.startswith("straggler: rank 1 (node 0, host ") and line.endswith("(attempt 0)")
    assert all(not t["stragglers"] for key, t in tasks.items() if key[0] != "train")
    text = subprocess.run([*cli, run.pathspec], capture_output=True, text=True, timeout=120, env=env,
                          check=True).stdout
    assert f"      {line}" in text.splitlines()  # under its task

    browser.get(f"{ui_server}/runs/StragglerFlow/{run.id}")
    item = _wait("the straggler list", lambda: browser.find_element("id", "stragglers").is_displayed()
                 and browser.find_element("css selector", "#stragglers li"))
    assert item.get_attribute("data-straggler") == "rank 1"
    assert f"train/{train.id} attempt 0: straggler: rank 1 (node 0, host " in item.text
    _wait("the straggler score chart", lambda: browser.find_element("id", "chart-straggler_score"))
    shots(browser, "10-stragglers")
