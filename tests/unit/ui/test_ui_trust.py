"""The UI loads pickled artifacts only through the attempt's signed manifest, never through the SQLite index
(which is not signed): an index row whose descriptor was changed (an injected pickle) is not unpickled."""

from __future__ import annotations

import base64
import os
import pickle
import time

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")

from starlette.testclient import TestClient  # noqa: E402

from stoker.store.artifacts import save_artifact  # noqa: E402
from stoker.store.blobs import LocalBlobStore  # noqa: E402
from stoker.store.manifest import write_manifest  # noqa: E402
from stoker.store.metadata import MetadataDB  # noqa: E402
from stoker.ui import content  # noqa: E402
from stoker.ui.app import create_app  # noqa: E402

FLOW, RUN = "TrustFlow", "1700000000000002"


class _Payload:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def _forged_index(tmp_path):
    """A signed manifest in the store (n=3, eval=...), and an index whose descriptors were replaced by a pickle
    that creates a folder when it is loaded (the injected fault)."""
    store = LocalBlobStore(tmp_path / "store")
    db = MetadataDB(tmp_path / "metadata.db")
    db.create_run(FLOW, RUN, user="tester", tags=[], params={})
    now = time.time()
    m = {"flow": FLOW, "run_id": RUN, "step": "evaluate", "task_id": "1", "attempt": 0, "status": "ok",
         "started_at": now - 1, "finished_at": now, "user": "tester", "hostname": "h", "exception": None,
         "artifacts": {"n": save_artifact(store, 3), "eval": save_artifact(store, {"loss": 1.0})}}
    write_manifest(store, m)
    marker = tmp_path / "pwned"
    body = pickle.dumps(_Payload(str(marker)), protocol=5)
    evil = {"kind": "pickle", "type": "int", "size": len(body), "repr": "3", "sha": None, "blobs": [],
            "inline": base64.b64encode(body).decode()}
    db.ingest_manifest({**m, "artifacts": {"n": dict(evil), "eval": dict(evil)}})  # the index only
    return store, db, marker


def test_ui_previews_come_from_the_signed_manifest_not_the_index(tmp_path):
    store, db, marker = _forged_index(tmp_path)
    app = create_app(store=store, db=db, home=tmp_path / "home")
    with TestClient(app) as client:
        arts = {a["name"]: a for a in client.get(f"/api/runs/{FLOW}/{RUN}/tasks/evaluate/1/artifacts").json()
                ["artifacts"]}
    assert not marker.exists(), "the UI unpickled a descriptor from the unsigned index"
    assert arts["n"]["preview"] == "3"  # the signed manifest's value


def test_ui_pipeline_values_come_from_the_signed_manifest(tmp_path):
    store, db, marker = _forged_index(tmp_path)
    value, found = content._value(db, store, FLOW, RUN, "eval")
    assert not marker.exists(), "the UI unpickled a descriptor from the unsigned index"
    assert found and value == {"loss": 1.0}
