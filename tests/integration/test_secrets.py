"""Secrets at rest (issue 13, Security): a secret parameter and an environment variable given with
`--with environment:vars=...` reach the steps, and appear nowhere in the store, the index, the logs, or what
`run`, `stoker show`, `stoker logs` and `python flow.py show` print, not even when a step's exception echoes the
secret (its manifest, traceback, log and @catch artifact). Also: resume refuses a forged origin manifest."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from stoker.store import open_store
from stoker.store.manifest import list_manifests
from tests.helpers import run_flow

TOKEN = "tok-9f3a1c7e-SECRET-PARAM"
ENV_VALUE = "env-4b2d8e61-SECRET-VAR"


def _scan(root, needles):
    hits = []
    for dirpath, _, files in os.walk(root):
        for f in files:
            path = os.path.join(dirpath, f)
            try:
                data = open(path, "rb").read()
            except OSError:
                continue
            hits += [f"{path}: {n}" for n in needles if n.encode() in data]
    return hits


@pytest.mark.parametrize("launch", ["fork", "subprocess"])
def test_secret_parameter_and_env_values_are_nowhere_at_rest(tmp_path, _stoker_home, launch):
    env = {"EXPECTED_TOKEN": TOKEN, "EXPECTED_ENV": ENV_VALUE, "STOKER_TASK_LAUNCH": launch}
    with_env = "environment:vars=" + json.dumps({"API_TOKEN": ENV_VALUE})
    p = run_flow("secret_flow.py", "run", "--token", TOKEN, "--with", with_env, cwd=tmp_path, env=env)
    run_id = next(line for line in p.stdout.splitlines() if "started" in line).split("SecretFlow/")[1].split()[0]
    shown = subprocess.run([sys.executable, "-m", "stoker.cli.main", "show", f"SecretFlow/{run_id}"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "token='***'" in shown.stdout
    graph = run_flow("secret_flow.py", "show", cwd=tmp_path)
    logs = subprocess.run([sys.executable, "-m", "stoker.cli.main", "logs", f"SecretFlow/{run_id}/leak",
                           "--all-attempts", "--stderr"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert logs.returncode == 0 and "the API refused the token '***'" in logs.stdout + logs.stderr, logs
    printed = (p.stdout + p.stderr + shown.stdout + shown.stderr + graph.stdout + graph.stderr + logs.stdout
               + logs.stderr)
    assert TOKEN not in printed and ENV_VALUE not in printed
    store = _stoker_home / "store"
    assert (store / "runs" / "SecretFlow" / run_id / "run.json").exists()
    assert list((_stoker_home).glob("metadata.db*"))
    assert _scan(_stoker_home, [TOKEN, ENV_VALUE]) == []  # the store, the SQLite index (and its WAL), the logs
    record = json.loads((store / "runs" / "SecretFlow" / run_id / "run.json").read_text())
    assert record["params"]["token"] == "***" and record["with"] == ['environment:vars={"API_TOKEN":"***"}']
    failed = [json.loads((store / n).read_text()) for n in list_manifests(open_store(str(store)), "SecretFlow", run_id)
              if "/leak/" in n]
    failed = [m["exception"] for m in failed if m.get("exception")]
    assert failed and all("'***'" in e["message"] and "'***'" in e["traceback"] for e in failed), failed


def test_resume_refuses_a_forged_origin_manifest(tmp_path, _stoker_home):
    p = run_flow("resume_flow.py", "run", cwd=tmp_path, check=False)
    assert p.returncode != 0  # work item 1 fails until RESUME_OK is set
    run_id = next(line for line in p.stdout.splitlines() if "started" in line).split("ResumeFlow/")[1].split()[0]
    store = open_store(str(_stoker_home / "store"))
    name = next(n for n in list_manifests(store, "ResumeFlow", run_id) if "/start/" in n)
    path = store.root / name
    doc = json.loads(path.read_text())
    doc["artifacts"]["start_pid"]["repr"] = "forged"
    os.chmod(path, 0o644)
    path.write_text(json.dumps(doc))
    r = run_flow("resume_flow.py", "resume", run_id, cwd=tmp_path, env={"RESUME_OK": "1"}, check=False)
    assert r.returncode != 0
    assert "bad signature" in r.stdout + r.stderr and "Traceback" not in r.stderr


def test_flow_show_prints_environment_names_not_values(capsys):
    from stoker.cli.flow_cli import print_graph
    from stoker.flow.decorators import apply_with
    from stoker.flow.graph import FlowGraph
    from tests.flows.secret_flow import SecretFlow

    apply_with(SecretFlow, ["environment:vars=" + json.dumps({"API_TOKEN": ENV_VALUE})])
    print_graph(FlowGraph(SecretFlow))
    out = capsys.readouterr().out
    assert "API_TOKEN" in out and "***" in out and ENV_VALUE not in out
