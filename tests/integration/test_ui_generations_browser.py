"""`stoker ui` lists a gang's generations (hot spares: which node left, its member, host and why, which spare
joined, the recovery time) and draws the recovery in the goodput bars, in a real headless browser (the fixtures of
tests/integration/test_ui_browser.py), on a Batch gang's records (tests/unit/ui/goodput_records.py) with the gang
objects of a node lost in attempt 1, laid out as stoker.distributed.gangboard writes them."""

from __future__ import annotations

import json
import time

import pytest

from stoker.client.gangs import gang_prefix
from tests.integration.test_ui_browser import _wait, browser, shots, ui_server  # noqa: F401  (fixtures)
from tests.integration.test_ui_goodput_browser import _ledger, check_bars
from tests.unit.ui.goodput_records import FLOW, write_run

pytestmark = pytest.mark.slow
RUN = "1700000000000011"


def test_the_generations_and_the_recovery(browser, ui_server, shots):  # noqa: F811
    from stoker.store.blobs import open_store
    from stoker.store.metadata import MetadataDB
    from stoker.store.paths import default_db_path

    store, db = open_store(), MetadataDB(default_db_path())
    t0 = time.time() - 400
    write_run(store, db, RUN, t0=t0)
    g = gang_prefix(FLOW, RUN, "train", "2", 1)
    lost = {"slot": 1, "member": 1, "host": "ip-10-0-0-2", "why": "lost: no heartbeat for 30 s", "at": t0 + 250}
    for name, doc in (("gen-000000.json", {"gen": 0, "slots": [0, 1], "decided_at": t0 + 160, "lost": None,
                                            "joined": None}),
                      ("gen-000001.json", {"gen": 1, "slots": [0, 2], "decided_at": t0 + 251, "lost": lost,
                                           "joined": 2}),
                      ("started-000001.json", {"gen": 1, "first_step_at": t0 + 262.5}),
                      ("member-2.json", {"member": 2, "host": "ip-10-0-0-3", "addr": "x", "state": "active", "at": 0}),
                      ("end.json", {"state": "done", "at": t0 + 320})):
        store.write(g + name, json.dumps(doc).encode())
    doc = _ledger(FLOW, RUN)
    assert doc["steps"][0]["seconds"]["recovery"] == pytest.approx(2 * 12.5)

    browser.get(f"{ui_server}/runs/{FLOW}/{RUN}")
    items = _wait("the generations", lambda: browser.find_elements("css selector", "#generation-list li"))
    assert browser.find_element("id", "generations").is_displayed()
    assert [e.get_attribute("data-generation") for e in items] == ["train/2/1/0", "train/2/1/1"]
    text = items[1].text
    assert "node 1 left (member 1, host ip-10-0-0-2): lost: no heartbeat for 30 s" in text, text
    assert "spare member 2 (host ip-10-0-0-3) took its place; recovered in 12.5 s" in text, text
    assert float(items[1].get_attribute("data-recovery")) == pytest.approx(12.5)
    _wait("the goodput section", lambda: browser.find_elements("css selector", "#goodput .gp-seg"))
    check_bars(browser, doc)
    assert browser.find_elements("css selector", '#goodput .gp-seg[data-category="recovery"]')
    shots(browser, "gang-generations")
