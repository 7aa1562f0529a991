"""Issue 25: a gang node that hangs (its process frozen, as a host that stops answering: no exit, no failure record,
the engine still says running) is found from its heartbeat, named as the lost node, and the gang is stopped within
seconds and retried; shown on the contract-only backend (tests/contract_backend.py), whose members are plain
processes. On a real Slurm cluster: tests/integration/test_slurm_faults.py."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import pytest

from stoker import Flow
from stoker.runtime.driver.launch import start_run
from tests.contract_backend import ProcessBackend
from tests.helpers import FLOWS

pytestmark = pytest.mark.slow


def _flow_class(path, name):
    spec = importlib.util.spec_from_file_location(f"flowmod_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return getattr(mod, name)


def test_a_frozen_node_is_named_lost_and_its_gang_retried(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STOKER_HEARTBEAT_TIMEOUT", "3")  # the nodes beat every second
    backend = ProcessBackend()
    cls = _flow_class(FLOWS / "gang_flow.py", "GangFlow")
    t0 = time.time()
    result = start_run(cls, lambda step: backend, params={"nodes": "2", "fail_node": "1", "how": "freeze"},
                       quiet=True)
    assert result.status == "succeeded", result.failures
    assert time.time() - t0 < 40, "node 0 sleeps 60 s on attempt 0: the gang was stopped when node 1 went silent"
    run = Flow("GangFlow")[result.run_id]
    assert run["join"].task.data.attempts == [1]
    work = sorted(run["work"], key=lambda t: t.data.node)
    root = Path(os.environ["STOKER_HOME"]) / "store" / "runs" / "GangFlow" / result.run_id / "work"
    first = {t.data.node: json.loads((root / t.id / "0" / "manifest.json").read_text()) for t in work}
    lost = first[1]["exception"]
    assert lost["type"] == "NodeLost" and lost["message"].startswith(f"node 1 (host {os.uname().nodename}) lost: "
                                                                      "no heartbeat for 3 s"), lost
    assert "because node 1 of its gang was lost" in first[0]["exception"]["message"], first[0]["exception"]
    beat = json.loads((root / work[0].id / "1" / "heartbeat.json").read_text())
    assert beat["state"] == "ended" and beat["code"] == 0 and beat["node"] == 0
