"""The UI's goodput endpoint and the failure causes it shows, through Starlette's TestClient over a real store folder
and a real SQLite index (tests/unit/ui/goodput_records.py writes them as the runtime and the trainer do)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")

from starlette.testclient import TestClient  # noqa: E402

from stoker.backends.aws.instances import price_per_hour  # noqa: E402
from stoker.client.goodput import CATEGORIES, run_goodput  # noqa: E402
from stoker.runtime.driver.causes import LABELS as CAUSE_LABELS  # noqa: E402
from stoker.store.blobs import LocalBlobStore  # noqa: E402
from stoker.store.metadata import MetadataDB  # noqa: E402
from stoker.ui.app import create_app  # noqa: E402
from stoker.ui.goodput import LABELS, LIVE_TTL_S, LedgerCache  # noqa: E402
from tests.unit.ui.goodput_records import FLOW, OOM_EVIDENCE, write_run  # noqa: E402

RUN = "1700000000000007"
URL = f"/api/runs/{FLOW}/{RUN}"


@pytest.fixture()
def records(tmp_path):
    store, db = LocalBlobStore(tmp_path / "store"), MetadataDB(tmp_path / "metadata.db")
    write_run(store, db, RUN, t0=1_700_000_000.0)
    return store, db


def test_the_ledger_priced_as_stoker_goodput_prices_it(records):
    store, db = records
    with TestClient(create_app(store=store, db=db)) as c:
        d = c.get(URL + "/goodput").json()
    assert d["error"] is None and d["labels"] == LABELS and set(LABELS) == set(CATEGORIES)
    doc = d["goodput"]
    assert doc == json.loads(json.dumps(run_goodput(store, FLOW, RUN, price=price_per_hour)))
    assert doc["version"] == 1 and doc["categories"] == list(CATEGORIES)
    (step,) = doc["steps"]
    assert [t["node"] for t in step["tasks"]] == [0, 1] and step["failures"] == 1
    node0 = step["tasks"][0]
    assert [a["status"] for a in node0["attempts"]] == ["failed", "ok"]
    assert node0["seconds"]["straggler_idle"] == 15 and node0["seconds"]["lost"] > 0
    assert node0["attempts"][1]["seconds"]["retry_wait"] == 10 and node0["attempts"][0]["seconds"]["queue"] == 30
    cost = doc["total"]["cost"]
    assert cost["prices"] == {"trn1.32xlarge": price_per_hour("trn1.32xlarge")} and cost["lost_usd"] > 0


def test_a_run_that_trained_nothing_has_no_ledger(records):
    store, db = records
    db.create_run(FLOW, "2", user="tester", params={})
    db.set_run_status(FLOW, "2", "succeeded")
    with TestClient(create_app(store=store, db=db)) as c:
        assert c.get(f"/api/runs/{FLOW}/2/goodput").json() == {"goodput": None, "error": None, "labels": LABELS,
                                                                "causes": CAUSE_LABELS}
        assert c.get(f"/api/runs/{FLOW}/999/goodput").status_code == 404
        assert c.get("/api/runs/..%2f..%2f/x/goodput").status_code == 404


def test_the_endpoint_needs_the_token(records):
    store, db = records
    with TestClient(create_app(store=store, db=db, token="s3cret")) as c:
        assert c.get(URL + "/goodput").status_code == 401
        assert c.get(URL + "/goodput", headers={"Authorization": "Bearer s3cret"}).json()["goodput"]["steps"]


def test_a_finished_runs_ledger_is_kept_a_running_runs_refreshed(records):
    """A finished run's records never change: its ledger is computed once. A running run's is at most
    LIVE_TTL_S old (the clock is injected)."""
    store, db = records
    now = [0.0]
    cache = LedgerCache(store, clock=lambda: now[0])
    first = cache.ledger(FLOW, RUN, finished=True)
    live = cache.ledger(FLOW, "5", finished=False)
    assert live["goodput"] is None
    write_run(store, db, "5", t0=1_700_000_000.0)  # records land
    assert cache.ledger(FLOW, "5", finished=False)["goodput"] is None, "within the TTL: the same answer"
    now[0] += LIVE_TTL_S + 0.1
    assert cache.ledger(FLOW, "5", finished=False)["goodput"]["steps"], "after it: recomputed"
    assert cache.ledger(FLOW, RUN, finished=True) is first


def test_failed_attempts_carry_their_cause_and_evidence(records):
    store, db = records
    db.set_run_status(FLOW, RUN, "failed")  # the failure box is shown for a run that did not succeed
    with TestClient(create_app(store=store, db=db)) as c:
        d = c.get(URL).json()
        page = c.get(f"/runs/{FLOW}/{RUN}").text
    tasks = {t["task_id"]: t for t in d["tasks"]}
    exc = tasks["3"]["attempts"][0]["exception"]
    assert (exc["cause"], exc["cause_label"], exc["evidence"]) == ("oom", "out of memory", OOM_EVIDENCE)
    assert tasks["3"]["attempts"][1]["exception"] is None
    f = d["failure"]  # node 1 failed on its own; node 0 was stopped with its gang
    assert (f["task_id"], f["node"], f["cause"], f["cause_label"]) == ("3", 1, "oom", "out of memory")
    assert f["evidence"] == OOM_EVIDENCE and f["type"] == "StokerError"
    assert 'id="goodput"' in page and 'id="failed-attempts"' in page and "/static/goodput.js" in page


def test_an_attempt_recorded_before_causes_has_none():
    from stoker.ui.data import _exception

    assert _exception({"type": "ValueError", "message": "boom"}) == {
        "type": "ValueError", "message": "boom", "traceback": "", "cause": None, "cause_label": None, "evidence": None}
