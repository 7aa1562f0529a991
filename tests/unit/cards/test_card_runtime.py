"""`current.card` and the @card decorator in-process, against a real local store folder: which card append
goes to, ids, rate-limited refresh, the final write, and the decorator's argument checks."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from stoker import card, step
from stoker.cards import Markdown, ProgressBar
from stoker.cards.runtime import start_task_cards
from stoker.cards.store import list_cards
from stoker.errors import ConfigError
from stoker.flow.current import current
from stoker.store.blobs import open_store


@pytest.fixture(autouse=True)
def _clean_current():
    """start_task_cards sets current.card in this process: leave `current` as other tests expect it."""
    yield
    current._clear()


def _spec(**kw):
    return SimpleNamespace(flow="F", run_id="7", step="s", task_id="3", attempt=0, user="me", parallel=None,
                           run_inputs={}, **kw)


def _func(*decos):
    def s(self):
        pass

    f = step(s)
    for d in decos:
        f = d(f)
    return f


def _read(store, card_id):
    return json.loads(store.read(f"runs/F/7/cards/s/3/0/{card_id}.json"))


def test_append_goes_to_the_unnamed_card_and_ids_select_the_others(tmp_path):
    store = open_store(str(tmp_path / "store"))
    tc = start_task_cards(_func(card(type="blank", id="extra"), card(type="blank")), _spec(), store)
    current.card.append(Markdown("to the unnamed card"))
    current.card["extra"].extend([Markdown("one"), Markdown("two")])
    current.card["missing"].append(Markdown("dropped with a warning"))
    assert "extra" in current.card and "missing" not in current.card
    tc.finish({}, {"status": "ok"})
    ids = [r.id for r in list_cards(store, "F", "7", "s", "3")]
    assert sorted(ids) == ["blank", "extra"]
    assert [c["text"] for c in _read(store, "extra")["components"]] == ["one", "two"]
    assert [c["text"] for c in _read(store, "blank")["components"]] == ["to the unnamed card"]


def test_refresh_is_rate_limited_and_the_last_state_still_lands(tmp_path):
    store = open_store(str(tmp_path / "store"))
    tc = start_task_cards(_func(card(type="blank", refresh_interval=0.5)), _spec(), store)
    bar = ProgressBar(max=10)
    current.card.append(bar)
    current.card.refresh()  # the first refresh writes at once
    assert _read(store, "blank")["components"][0]["value"] == 0
    bar.update(5)
    current.card.refresh()  # within the interval: deferred
    assert _read(store, "blank")["components"][0]["value"] == 0
    deadline = time.time() + 5
    while _read(store, "blank")["components"][0]["value"] != 5:
        assert time.time() < deadline, "the deferred refresh never wrote the card"
        time.sleep(0.05)
    bar.update(7)
    current.card.refresh(force=True)
    assert _read(store, "blank")["components"][0]["value"] == 7
    tc.finish({}, {"status": "ok"})
    final = _read(store, "blank")
    assert final["final"] is True and final["components"][0]["value"] == 7


def test_default_card_shows_artifacts_and_the_error(tmp_path):
    store = open_store(str(tmp_path / "store"))
    tc = start_task_cards(_func(card), _spec(), store)
    current.card.append(Markdown("mine"))
    arts = {"x": {"type": "int", "size": 5, "repr": "42"}, "_private": {"type": "int", "size": 1, "repr": "0"}}
    tc.finish(arts, {"status": "failed", "exception": {"type": "ValueError", "message": "<b>bad</b>",
                                                        "traceback": "tb"}})
    data = _read(store, "default")
    tables = [c for c in data["components"] if c["type"] == "table"]
    assert ["x", "int", "5 B", "42"] in tables[-1]["data"] and all(r[0] != "_private" for r in tables[-1]["data"])
    assert any(c["type"] == "error" and "ValueError: <b>bad</b>" in c["message"] for c in data["components"])
    html = store.read("runs/F/7/cards/s/3/0/default.html").decode()
    assert "&lt;b&gt;bad&lt;/b&gt;" in html and "mine" in html


def test_a_step_without_card_has_no_current_card(tmp_path):
    """As in Metaflow: `hasattr(current, "card")` is the docs' guard for code that runs with or without @card."""
    store = open_store(str(tmp_path / "store"))
    tc = start_task_cards(_func(), _spec(), store)
    assert not hasattr(current, "card")
    tc.finish({}, {"status": "ok"})
    assert list_cards(store, "F", "7", "s", "3") == []


@pytest.mark.parametrize("kwargs, message", [({"type": "fancy-type"}, "letters, digits and '_'"),
                                             ({"id": "a b"}, "letters, digits"),
                                             ({"refresh_interval": -1}, "at least 0"),
                                             ({"colour": 1}, "has no argument colour")])
def test_card_decorator_arguments_are_checked(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        card(**kwargs)(lambda self: None)
