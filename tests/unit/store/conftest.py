"""Fixtures of the store tests: a local store, a metadata DB, and a builder of recorded runs."""

from __future__ import annotations

import time
from typing import Any

import pytest

from stoker.store import MetadataDB, open_store, save_artifact
from stoker.store.blobs import LocalBlobStore
from stoker.store.manifest import log_name, write_manifest
from stoker.store.paths import default_db_path


@pytest.fixture
def store(tmp_path) -> LocalBlobStore:
    return LocalBlobStore(tmp_path / "store")


@pytest.fixture
def db(tmp_path):
    d = MetadataDB(tmp_path / "metadata.db")
    yield d
    d.close()


class RunMaker:
    """Records runs the way the runtime does: artifacts + logs + manifest in the store, rows in the DB."""

    def __init__(self, store: LocalBlobStore, db: MetadataDB) -> None:
        self.store, self.db = store, db
        self.clock = time.time() - 1000.0

    def tick(self) -> float:
        self.clock += 1.0
        return self.clock

    def run(self, flow: str, run_id: str, *, user: str = "alice", tags=(), params=None,
            status: str = "succeeded") -> None:
        self.db.create_run(flow, run_id, user=user, tags=tags, params=params or {}, created_at=self.tick())
        if status != "running":
            self.db.set_run_status(flow, run_id, status, finished_at=self.tick())

    def task(self, flow: str, run_id: str, step: str, task_id: str, *, attempt: int = 0,
             status: str = "ok", data: dict[str, Any] | None = None, stdout: str = "", stderr: str = "",
             exception: dict | None = None, foreach_stack=(), parallel=None, user: str = "alice",
             ingest: bool = True) -> dict[str, Any]:
        logs = {}
        for stream, text in (("stdout", stdout), ("stderr", stderr)):
            name = log_name(flow, run_id, step, task_id, attempt, stream)
            self.store.write(name, text.encode())
            logs[stream] = name
        started = self.tick()
        manifest = {
            "flow": flow, "run_id": run_id, "step": step, "task_id": task_id, "attempt": attempt,
            "status": status, "started_at": started, "finished_at": self.tick(),
            "artifacts": {k: save_artifact(self.store, v, name=k) for k, v in (data or {}).items()},
            "exception": exception, "logs": logs, "input_paths": [], "foreach_stack": list(foreach_stack),
            "parallel": parallel, "user": user, "hostname": "testhost", "origin_task": None,
            "retry_count": attempt, "catch_var": None,
        }
        write_manifest(self.store, manifest)
        if ingest:
            self.db.ingest_manifest(manifest)
        return manifest


@pytest.fixture
def maker(store, db) -> RunMaker:
    return RunMaker(store, db)


@pytest.fixture
def maker_default(_stoker_home):
    """Runs recorded at the default locations ($STOKER_HOME), for a client given no db/store."""
    db = MetadataDB(default_db_path())
    m = RunMaker(open_store(), db)
    m.run("Defaults", "1")
    m.task("Defaults", "1", "end", "1", data={"answer": 42}, stdout="done\n")
    yield m
    db.close()


@pytest.fixture(autouse=True)
def _fresh_namespace(monkeypatch):
    """Each test starts in the default namespace (the client keeps it in a module global)."""
    from stoker.client import namespaces as namespaces

    monkeypatch.setattr(namespaces, "_namespace", namespaces._UNSET)
    monkeypatch.setenv("USER", "alice")
    monkeypatch.delenv("STOKER_USER", raising=False)
