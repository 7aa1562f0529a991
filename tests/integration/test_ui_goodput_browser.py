"""`stoker ui` draws the goodput ledger and names why attempts failed, in a real headless browser (the fixtures of
tests/integration/test_ui_browser.py): a real run of tests/flows/goodput_flow.py, whose trainer is SIGKILLed on
attempt 0 and retried; and a Batch gang's records written as the runtime writes them (tests/unit/ui/goodput_records.py)
for what a local run has not: a price, an out-of-memory cause, stragglers' idle time. Each bar's segments are
measured in the page against the ledger's seconds."""

from __future__ import annotations

import time

import pytest

from tests.helpers import run_flow
from tests.integration.test_ui_browser import _wait, browser, shots, ui_server  # noqa: F401  (fixtures)
from tests.unit.ui.goodput_records import FLOW, OOM_EVIDENCE, write_run

pytestmark = pytest.mark.slow
PX = 1.0  # a segment's width may differ from its share of the track by this much (layout rounding)

# every bar of the section: its key, its track's width, its scale, and each segment's category, seconds and width
BARS_JS = """return Array.prototype.map.call(document.querySelectorAll('#goodput .gp-row'), function (row) {
  var track = row.querySelector('.gp-track'), box = track.getBoundingClientRect();
  return {key: row.dataset.bar, width: box.width, left: box.left, scale: parseFloat(track.dataset.scale),
    segs: Array.prototype.map.call(track.querySelectorAll('.gp-seg'), function (s) { var r = s.getBoundingClientRect();
      return {category: s.dataset.category, seconds: parseFloat(s.dataset.seconds), width: r.width, left: r.left}; })};
});"""


def _ledger(flow: str, run_id: str) -> dict:
    from stoker.backends.aws.instances import price_per_hour
    from stoker.client.goodput import run_goodput
    from stoker.store.blobs import open_store

    return run_goodput(open_store(), flow, run_id, price=price_per_hour)


def _positive(seconds: dict) -> float:
    return sum(v for v in seconds.values() if v > 0)


def check_bars(driver, doc: dict) -> None:
    """One bar for the run's node-time, one per attempt of every node; every segment's width is its seconds' share of
    its bar's scale (the run's node-time; for attempts, the longest attempt)."""
    attempts = {f"{s['step']}/{t['task_id']}/{a['attempt']}": a for s in doc["steps"] for t in s["tasks"]
                for a in t["attempts"]}
    longest = max(max(a["wall_s"], _positive(a["seconds"])) for a in attempts.values())
    want = {"total": (doc["total"]["seconds"], max(doc["total"]["node_seconds"], _positive(doc["total"]["seconds"])))}
    want.update({k: (a["seconds"], longest) for k, a in attempts.items()})
    bars = driver.execute_script(BARS_JS)
    assert [b["key"] for b in bars] == list(want), "the run's total first, then each node's attempts"
    for b in bars:
        seconds, scale = want[b["key"]]
        assert b["scale"] == pytest.approx(scale, rel=1e-6) and b["width"] > 300
        drawn = [c for c in doc["categories"] if seconds[c] > 0]
        assert [s["category"] for s in b["segs"]] == drawn, "in the ledger's stacked order"
        x = b["left"]
        for s in b["segs"]:
            assert s["seconds"] == pytest.approx(seconds[s["category"]], rel=1e-6)
            assert abs(s["width"] - b["width"] * s["seconds"] / scale) <= PX, (b["key"], s, b["width"], scale)
            assert abs(s["left"] - x) <= PX, "segments follow each other"
            x = s["left"] + s["width"]


def check_legend(driver, doc: dict) -> list[str]:
    from stoker.ui.goodput import LABELS

    total = doc["total"]
    legend = driver.find_elements("css selector", "#goodput-legend span")
    cats = [e.get_attribute("data-category") for e in legend]
    assert cats == [c for c in doc["categories"] if abs(total["seconds"][c]) >= 0.0005 or c == "productive"]
    for e, c in zip(legend, cats, strict=True):
        share = 100 * total["seconds"][c] / total["node_seconds"]
        assert e.text.startswith(LABELS[c]) and e.text.endswith(f"{share:.1f} %"), e.text
    fig = driver.find_element("id", "goodput-figure")
    assert float(fig.get_attribute("data-goodput")) == pytest.approx(total["goodput"])
    assert fig.text == f"goodput {100 * total['goodput']:.1f} %"
    return cats


def test_the_ledger_and_the_failed_attempts_cause(browser, ui_server, shots, tmp_path):  # noqa: F811
    """goodput_flow.py: attempt 0 of the train step is killed after a checkpoint and retried; the run page draws its
    ledger and names the failed attempt's cause with its evidence."""
    pytest.importorskip("torch")
    from tests.integration.test_goodput_flow import tokens

    p = run_flow("goodput_flow.py", "run", "--data", str(tokens(tmp_path)), "--steps", "30", cwd=tmp_path,
                 env={"STOKER_METRICS_INTERVAL": "0.2", "STOKER_STORE": ""}, timeout=600)
    assert "killing the trainer" in p.stdout + p.stderr
    from stoker import Flow
    from stoker.runtime.driver.causes import LABELS as CAUSES

    run = Flow("GoodputFlow").latest_run
    doc = _ledger("GoodputFlow", run.id)
    (step,) = doc["steps"]
    (task,) = step["tasks"]
    assert [a["status"] for a in task["attempts"]] == ["failed", "ok"] and step["failures"] == 1
    failed = next(a for a in run["train"].task.attempts if not a.successful)
    exc = failed.exception
    assert exc.cause and exc.evidence

    browser.get(f"{ui_server}/runs/GoodputFlow/{run.id}")
    _wait("the goodput section", lambda: browser.find_element("id", "goodput").is_displayed()
          and browser.find_elements("css selector", "#goodput .gp-seg"))
    check_bars(browser, doc)
    cats = check_legend(browser, doc)
    assert {"startup", "productive", "lost", "checkpoint_save", "checkpoint_load"} <= set(cats)
    assert browser.find_element("id", "goodput-tps").text == f"{round(step['tokens_per_s']):,} tokens/s"
    assert not browser.find_elements("id", "goodput-cost"), "a local run has no price"

    key = f"train/{task['task_id']}/0"
    item = browser.find_element("css selector", f'#failed-list li[data-attempt="{key}"]')
    assert item.get_attribute("data-cause") == exc.cause
    assert f"{CAUSES[exc.cause]}: {exc.evidence}" in item.text and "retried: attempt 1 ok" in item.text
    row = browser.find_elements("css selector", f'#tasks tr[data-task="train/{task["task_id"]}"]')[0]
    assert row.find_element("css selector", ".cause").text == CAUSES[exc.cause]
    assert exc.evidence in row.text
    browser.execute_script("document.getElementById('failed-attempts').scrollIntoView()")
    folder = shots(browser, "11-goodput-ledger").parent
    browser.find_element("id", "goodput").screenshot(str(folder / "11-goodput-section.png"))


def test_cost_causes_and_straggler_idle_of_a_batch_gang(browser, ui_server, shots):  # noqa: F811
    """A 2-node Batch gang priced by its instance type, node 1 out of memory on attempt 0 (node 0 stopped with it),
    node 0's ranks idle for stragglers; and a run that trained nothing shows no ledger at all."""
    from stoker.store.blobs import open_store
    from stoker.store.metadata import MetadataDB
    from stoker.store.paths import default_db_path

    store, db = open_store(), MetadataDB(default_db_path())
    write_run(store, db, "1700000000000007", t0=time.time() - 400)
    db.create_run(FLOW, "1700000000000008", user="tester", params={})
    db.set_run_status(FLOW, "1700000000000008", "succeeded")
    doc = _ledger(FLOW, "1700000000000007")

    browser.get(f"{ui_server}/runs/{FLOW}/1700000000000007")
    _wait("the goodput section", lambda: browser.find_element("id", "goodput").is_displayed()
          and browser.find_elements("css selector", "#goodput .gp-seg"))
    check_bars(browser, doc)
    assert {"queue", "retry_wait", "straggler_idle", "eval", "lost"} <= set(check_legend(browser, doc))
    cost = browser.find_element("id", "goodput-cost").text
    assert f"lost work cost about ${doc['total']['cost']['lost_usd']:.2f}" in cost and "trn1.32xlarge" in cost
    idle = _wait("the stragglers' idle time", lambda: browser.find_elements("css selector", "#stragglers li"))
    assert [e.get_attribute("data-straggler-idle") for e in idle] == ["train/2/0", "train/2/1"]
    assert "train/2 node 0 attempt 0: its ranks waited 6.00 s" in idle[0].text
    causes = {e.get_attribute("data-attempt"): e for e in browser.find_elements("css selector", "#failed-list li")}
    assert set(causes) == {"train/2/0", "train/3/0"}
    assert f"out of memory: {OOM_EVIDENCE}" in causes["train/3/0"].text
    assert "out of memory: stopped with its gang: node 1 failed" in causes["train/2/0"].text
    a0 = doc["steps"][0]["tasks"][1]["attempts"][0]
    note = browser.find_element("css selector", '.gp-row[data-bar="train/3/0"] .gp-note').text
    assert note.startswith("out of memory · " if a0.get("cause") else "steps ") and "steps 0→80, 20 recomputed" in note
    folder = shots(browser, "12-goodput-batch-gang").parent
    browser.find_element("id", "goodput").screenshot(str(folder / "12-goodput-batch-gang-section.png"))

    browser.get(f"{ui_server}/runs/{FLOW}/1700000000000008")
    _wait("the page", lambda: browser.find_element("id", "run-status").get_attribute("data-status") == "succeeded")
    _wait("the ledger's answer", lambda: browser.find_element("id", "goodput").get_attribute("data-loaded"))
    assert not browser.find_element("id", "goodput").is_displayed()
    assert browser.find_element("id", "goodput-body").get_attribute("innerHTML") == ""
    assert not browser.find_element("id", "failed-attempts").is_displayed()
