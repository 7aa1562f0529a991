"""The manifests the scheduler writes itself (stoker.store.manifest.Manifest: failed, with_reason) for attempts of a
remote backend: one that could not be submitted, and one that failed for a reason its engine knows."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from stoker.errors import BackendError
from stoker.runtime.contract import EXITED
from stoker.runtime.driver.launch import start_run
from stoker.store import open_store
from stoker.store.manifest import Manifest, latest_manifest, list_manifests, read_manifest_object
from tests.contract_backend import ProcessBackend
from tests.helpers import FLOWS

pytestmark = pytest.mark.slow


def _flow_class(path, name):
    spec = importlib.util.spec_from_file_location(f"flowmod_manifests_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return getattr(mod, name)


class Refuses(ProcessBackend):
    name = "refuses"

    def submit(self, request):
        raise BackendError("the queue 'gpu' does not exist")


class KnowsWhy(ProcessBackend):
    """An engine that says why a job that failed ended (Slurm's OUT_OF_MEMORY)."""

    name = "knowswhy"

    def poll(self, refs):
        out = super().poll(refs)
        for s in out.values():
            for m in [s, *s.members.values()]:
                if m.state == EXITED and m.exit_code:
                    m.reason = "out of memory"
        return out


def _work_manifests(run_id: str) -> list[Manifest]:
    store = open_store()
    return [Manifest.from_dict(latest_manifest(store, "ResumeFlow", run_id, "work", str(task_id)))
            for task_id in (2, 3, 4)]


def test_a_task_that_could_not_be_submitted_has_a_signed_failed_manifest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    here, refuses = ProcessBackend(), Refuses()
    cls = _flow_class(FLOWS / "resume_flow.py", "ResumeFlow")
    result = start_run(cls, lambda step: refuses if step == "work" else here, params={}, quiet=True)
    assert result.status == "failed" and "could not be submitted to refuses" in result.failures[0]
    store = open_store()
    names = [n for n in list_manifests(store, "ResumeFlow", result.run_id) if "/work/" in n]
    assert len(names) == 1, "the first refusal stops the run: the other tasks are never submitted"
    m = Manifest.from_dict(read_manifest_object(store, names[0]))  # its signature verified
    assert m.status == "failed" and m.artifacts == {} and m.finished_at >= m.started_at and m.attempt == 0
    assert {k: m.exception[k] for k in ("type", "message", "traceback")} == {
        "type": "BackendError", "message": "the queue 'gpu' does not exist", "traceback": ""}
    assert m.exception["cause"] and "refused the submission" in m.exception["evidence"]  # issue 25's attribution
    assert m.foreach_stack[0]["step"] == "start" and m.logs["stderr"] == names[0].replace("manifest.json", "stderr.log")


def test_a_failure_the_engine_explains_says_so_in_its_manifest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    backend = KnowsWhy()
    cls = _flow_class(FLOWS / "resume_flow.py", "ResumeFlow")
    result = start_run(cls, lambda step: backend, params={}, quiet=True)
    assert result.status == "failed"
    ok0, broken, ok2 = _work_manifests(result.run_id)
    assert ok0.status == ok2.status == "ok" and ok0.exception is None
    assert broken.status == "failed" and broken.exception["type"] == "RuntimeError"
    assert broken.exception["message"] == "work item 1 breaks until RESUME_OK is set (knowswhy: out of memory)"
    assert "Traceback" in broken.exception["traceback"]
