"""`stoker reindex` indexes every run it can verify and names the ones it refuses (issue 34 item 18): one run whose
record fails verification no longer throws the whole index away."""

from __future__ import annotations

import argparse
import json
import os

from stoker.cli.reindex import cmd_reindex
from stoker.store import MetadataDB, open_store
from stoker.store.manifest import manifest_name, run_record_name, write_run_record
from stoker.store.paths import default_db_path
from tests.unit.store.conftest import RunMaker


def _forge(store, name: str) -> None:
    path = store.root / name
    doc = json.loads(path.read_text())
    doc["user"] = "mallory"
    os.chmod(path, 0o644)
    path.write_text(json.dumps(doc))


def test_a_run_that_fails_verification_costs_only_that_run(_stoker_home, capsys):
    store, db = open_store(), MetadataDB(default_db_path())
    maker = RunMaker(store, db)
    for run_id in ("1", "2", "3"):
        write_run_record(store, {"flow": "F", "run_id": run_id, "user": "alice", "params": {},
                                 "status": "succeeded", "finished_at": 1.0})
        maker.run("F", run_id)
        maker.task("F", run_id, "start", "1", data={"x": int(run_id)})
    db.close()
    _forge(store, run_record_name("F", "2"))  # a record changed after it was written
    _forge(store, manifest_name("F", "3", "start", "1", 0))  # a manifest changed after it was written
    code = cmd_reindex(argparse.Namespace(force=True))
    out, err = capsys.readouterr()
    assert code == 1
    assert "reindexed 1 run(s), 1 task attempt(s)" in out
    assert "F/2: " in err and "F/3: " in err and "bad signature" in err and "F/1" not in err
    with MetadataDB(default_db_path()) as db:
        assert db.get_run("F", "1") is not None, "the verifiable run is indexed"
        assert db.get_run("F", "2") is None and db.get_run("F", "3") is None, "the refused runs left no rows"
