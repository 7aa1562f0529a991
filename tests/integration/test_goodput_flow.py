"""The goodput ledger of a real run (tests/flows/goodput_flow.py): a @torchrun training step whose trainer is
SIGKILLed mid-training on attempt 0 and retried, resuming from its checkpoint. The ledger's categories add up to
the step's wall time as the manifests give it, the killed attempt lost work, the retry waited, loaded a checkpoint
and trained; `Run.goodput`, `stoker goodput --json` and `stoker show` say the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import run_flow

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def tokens(tmp_path: Path) -> Path:
    rng = np.random.default_rng(1)
    base = rng.integers(0, 256, size=97)
    path = tmp_path / "tokens.bin"
    np.concatenate([np.roll(base, i % 5) for i in range(22)]).astype(np.uint16).tofile(path)
    return path


@pytest.mark.parametrize("nodes", [1, 2])
def test_a_killed_and_retried_training_step_is_accounted_for(tmp_path, nodes):
    home = tmp_path / "home"
    env = {"STOKER_HOME": str(home), "STOKER_METRICS_INTERVAL": "0.2", "STOKER_STORE": ""}
    p = run_flow("goodput_flow.py", "run", "--data", str(tokens(tmp_path)), "--nodes", str(nodes), cwd=tmp_path,
                 env=env, timeout=600)
    assert "killing the trainer" in p.stdout + p.stderr, "attempt 0's trainer was killed mid-training"
    os.environ["STOKER_HOME"] = str(home)
    from stoker import Flow

    run = Flow("GoodputFlow").latest_run
    assert run.successful
    doc = run.goodput
    (step,) = doc["steps"]
    assert step["step"] == "train" and [t["node"] for t in step["tasks"]] == list(range(nodes))
    for task in step["tasks"]:
        check_node(run, task)
    assert 0 < step["goodput"] < 1 and step["tokens"] == 60 * 4 * nodes * 32, "a gang's steps count once"
    assert step["failures"] == 1 and step["checkpoint"]["saves"] >= 2
    assert step["node_seconds"] == pytest.approx(sum(t["wall_s"] for t in step["tasks"]))
    check_commands(home, run, doc)


@pytest.mark.aws
def test_on_emulated_batch(batch_env, tmp_path, monkeypatch):
    """The same on AWS Batch (emulated: tests/batch_emulator.py): a 2-node job, its nodes' ledgers and timings in the
    S3 store, the job records' submission and start times; the retry is a second job."""
    env = {**batch_env, "STOKER_METRICS_INTERVAL": "0.2"}
    p = run_flow("goodput_flow.py", "run", "--backend", "batch=train", "--data", str(tokens(tmp_path)), "--nodes", "2",
                 "--ckpt", str(tmp_path / "ckpt"), cwd=tmp_path, env=env, timeout=600)
    assert "killing the trainer" in p.stdout + p.stderr
    monkeypatch.setenv("STOKER_HOME", batch_env["STOKER_HOME"])  # the client reads the run where the flow wrote it
    monkeypatch.setenv("STOKER_STORE", batch_env["STOKER_STORE"])
    from stoker import Flow

    run = Flow("GoodputFlow").latest_run
    doc = run.goodput
    (step,) = doc["steps"]
    assert [t["node"] for t in step["tasks"]] == [0, 1]
    for task in step["tasks"]:
        check_node(run, task, queued=True)
        for a in task["attempts"]:
            assert a["backend"] == "batch" and a["startup"].get("code_package", 0) > 0
    assert step["tokens"] == 60 * 8 * 32 and not [n for n in doc["notes"] if "not explained" in n]


@pytest.mark.slurm
def test_on_slurm(tmp_path, slurm_cluster, monkeypatch):
    """The same as a 2-node job on a real Slurm cluster (localhost): the job records' submission times, the nodes'
    code package timed, the ledgers in the run's store (the test folder stands for the shared filesystem)."""
    monkeypatch.setenv("STOKER_SHARED_PATHS", str(tmp_path))
    p = run_flow("goodput_flow.py", "run", "--backend", "slurm=train", "--data", str(tokens(tmp_path)), "--nodes", "2",
                 "--ckpt", str(tmp_path / "ckpt"), cwd=tmp_path, env={"STOKER_METRICS_INTERVAL": "0.2"}, timeout=600)
    assert "killing the trainer" in p.stdout + p.stderr
    from stoker import Flow

    run = Flow("GoodputFlow").latest_run
    doc = run.goodput
    (step,) = doc["steps"]
    assert [t["node"] for t in step["tasks"]] == [0, 1]
    for task in step["tasks"]:
        check_node(run, task, queued=True)
        for a in task["attempts"]:
            assert a["backend"] == "slurm" and a["startup"].get("code_package", 0) > 0
    assert step["tokens"] == 60 * 8 * 32 and not [n for n in doc["notes"] if "not explained" in n]


@pytest.fixture
def batch_env(aws, tmp_path):
    from tests.batch_emulator import emulated_batch_env

    return emulated_batch_env(aws, tmp_path)


def check_node(run, task: dict, queued: bool = False) -> None:
    from stoker.store.manifest import read_manifest

    a0, a1 = task["attempts"]

    # the wall time from the records alone: attempt 0's submission (local: its start) to attempt 1's end
    m0, m1 = (read_manifest(run._store, "GoodputFlow", run.id, "train", task["task_id"], a) for a in (0, 1))
    wall = m1["finished_at"] - (a0["begin"] if queued else m0["started_at"])
    assert a0["begin"] <= m0["started_at"] - sum(v for k, v in (m0.get("timings") or {}).items()
                                                  if k in ("node_setup", "code_package"))
    explained = sum(v for k, v in task["seconds"].items() if k != "other")
    assert abs(explained - wall) <= 0.01 * wall, (explained, wall, task["seconds"])
    for a in (a0, a1):
        assert abs(sum(v for k, v in a["seconds"].items() if k != "other")) == pytest.approx(a["wall_s"], rel=0.01)

    assert a0["status"] == "failed" and a0["seconds"]["lost"] > 0 and a0["seconds"]["productive"] > 0
    assert a0["steps"]["kept"] >= 4 and task["seconds"]["checkpoint_save"] > 0
    assert a1["status"] == "ok" and a1["seconds"]["retry_wait"] > 0
    assert a1["steps"]["first"] == a0["steps"]["kept"], "the retry resumed where the ledger says work was kept"
    assert a1["seconds"]["checkpoint_load"] > 0 and a1["seconds"]["productive"] > 0 and a1["steps"]["last"] == 60
    assert a1["startup"].get("launch", 0) > 0 and a1["startup"].get("trainer_init", 0) > 0


def check_commands(home: Path, run, doc: dict) -> None:
    cli_env = {**os.environ, "STOKER_HOME": str(home)}
    out = subprocess.run([sys.executable, "-m", "stoker.cli.main", "goodput", f"GoodputFlow/{run.id}", "--json"],
                         env=cli_env, capture_output=True, text=True, timeout=120, check=True).stdout
    assert json.loads(out) == json.loads(json.dumps(doc)), "`stoker goodput --json` is Run.goodput"
    text = subprocess.run([sys.executable, "-m", "stoker.cli.main", "goodput", f"GoodputFlow/{run.id}"],
                          env=cli_env, capture_output=True, text=True, timeout=120, check=True).stdout
    assert "lost work" in text and "attempt 0 (failed" in text
    show = subprocess.run([sys.executable, "-m", "stoker.cli.main", "show", f"GoodputFlow/{run.id}"],
                          env={**cli_env, "COLUMNS": "200"}, capture_output=True, text=True, timeout=120,
                          check=True).stdout
    assert "goodput: " in show and f"stoker goodput GoodputFlow/{run.id}" in show
