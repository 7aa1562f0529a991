"""`stoker runs` and `stoker show`: readable at 80 columns when not on a terminal (no line longer than the width,
run ids never cut), and `--json` with stable keys for scripts."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

from stoker.cli.listing import runs_table, show_lines
from tests.helpers import FLOWS

FLOW = FLOWS / "metaflow" / "runner_flow.py"
RUN_KEYS = ["created_at", "duration_s", "finished_at", "flow", "pathspec", "run_id", "status", "tags", "user"]


def _record(i: int, flow: str = "AVeryLongFlowNameForTesting", tags: tuple[str, ...] = ()) -> dict:
    return {"flow": flow, "run_id": f"17963277235042{i:02d}", "pathspec": f"{flow}/x", "status": "succeeded",
            "user": "someone.with.a.long.name", "created_at": None, "finished_at": None, "duration_s": 1234.5,
            "tags": list(tags)}


def test_runs_table_fits_and_keeps_run_ids():
    records = [_record(i, tags=("experiment:baseline", "dataset:shakespeare", "owner:team-a")) for i in range(3)]
    created = [dt.datetime(2026, 1, 2, 3, 4, 5)] * 3
    for cols in (120, 80, 60, 50):
        lines = runs_table(records, created, cols)
        assert all(len(line) <= cols for line in lines), (cols, lines)
        assert all(r["run_id"] in line for r, line in zip(records, lines[1:], strict=True))
    wide = runs_table(records, created, 200)
    assert "2026-01-02 03:04:05" in wide[1] and "owner:team-a" in wide[1]


def test_show_lines_wrap_long_lists():
    arts = [f"artifact_number_{i}" for i in range(30)]
    rec = {"pathspec": "AVeryLongFlowNameForTesting/1796327723504278", "status": "succeeded", "user": "u",
           "duration_s": 3.0, "origin_run_id": "1796327723504000", "tags": ["t"], "parameters": {"alpha": 5},
           "steps": [{"name": "start", "tasks": [{"id": "1", "attempt": 0, "successful": True,
                                                    "exception": None, "artifacts": arts}]},
                     {"name": "end", "tasks": [{"id": "2", "attempt": 1, "successful": False,
                                                  "exception": {"type": "ValueError", "message": "x " * 80},
                                                  "artifacts": []}]}],
           "cost": None}
    lines = show_lines(rec, dt.datetime(2026, 1, 2), 80)
    assert all(len(line) <= 80 for line in lines), lines
    assert all(a in "\n".join(lines) for a in arts) and "ValueError" in "\n".join(lines)


def _stoker(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run([sys.executable, "-m", "stoker.cli.main", *args], capture_output=True, text=True,
                          timeout=120, env={**env, "STOKER_HOME": str(home)})


def test_runs_and_show_json_and_plain_output(tmp_path: Path, _stoker_home: Path):
    flow = tmp_path / "runner_flow.py"
    flow.write_text(FLOW.read_text().replace("from metaflow import", "from stoker import"))
    p = subprocess.run([sys.executable, str(flow), "run", "--alpha", "2", "--tag", "a-rather-long-tag:value",
                        "--tag", "another-tag:with-a-long-value"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    runs = json.loads(_stoker("runs", "--json", home=_stoker_home).stdout)
    assert len(runs) == 1 and sorted(runs[0]) == RUN_KEYS
    run = runs[0]
    assert run["flow"] == "RunnerFlow" and run["status"] == "succeeded" and run["duration_s"] >= 0
    assert run["tags"] == ["a-rather-long-tag:value", "another-tag:with-a-long-value"]
    assert dt.datetime.fromisoformat(run["created_at"]).tzinfo is not None
    shown = json.loads(_stoker("show", run["pathspec"], "--json", home=_stoker_home).stdout)
    assert {k: shown[k] for k in RUN_KEYS} == run
    assert shown["parameters"]["alpha"] == 2 and [s["name"] for s in shown["steps"]] == ["end", "middle", "start"] \
        or sorted(s["name"] for s in shown["steps"]) == ["end", "middle", "start"]
    task = shown["steps"][0]["tasks"][0]
    assert sorted(task) == ["artifacts", "attempt", "exception", "failed_attempts", "finished", "id", "pathspec",
                            "stragglers", "successful"]
    assert task["failed_attempts"] == []  # every task succeeded at once
    for args in (["runs"], ["show", run["pathspec"]]):  # not a terminal, no $COLUMNS: 80 columns
        out = _stoker(*args, home=_stoker_home)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() and max(len(line) for line in out.stdout.splitlines()) <= 80, out.stdout
        assert run["run_id"] in out.stdout
