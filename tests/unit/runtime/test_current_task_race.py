"""`current.task` in a task that starts before the scheduler has indexed it (the scheduler indexes the attempts a
pass started after forking them; a fast task can get there first): the task indexes its own attempt, as the
scheduler would, instead of failing with NotFound. Real SQLite index, no scheduler needed."""

from __future__ import annotations

import pytest

from stoker.client.namespaces import NotFound
from stoker.flow.current import current
from stoker.store import MetadataDB


def test_a_task_not_yet_indexed_indexes_itself(tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_HOME", str(tmp_path))
    db = MetadataDB(tmp_path / "metadata.db")
    db.create_run("RaceFlow", "7", user="alice", params={})
    current._set(flow_name="RaceFlow", run_id="7", step_name="start", task_id="1", retry_count=0,
                 username="alice", is_running_flow=True)
    try:
        task = current.task
        assert task.pathspec == "RaceFlow/7/start/1" and not task.finished
        attempt = db.get_attempt("RaceFlow", "7", "start", "1", 0)
        assert attempt is not None and attempt.status == "running"
        db.register_attempt("RaceFlow", "7", "start", "1", 0, user="alice")  # the scheduler's, later: no change
        assert db.get_task("RaceFlow", "7", "start", "1").status == "running"
        current._set(run_id="no-such-run")  # the run itself must exist: nothing is invented for it
        with pytest.raises(NotFound):
            _ = current.task
        assert db.get_run("RaceFlow", "no-such-run") is None
    finally:
        current._clear()
