"""Custom card types: where stoker finds them (a `metaflow_extensions` package, the `stoker.cards` entry point
group, register_card), how one is rendered (Metaflow's arguments, error card, time limit, reload token), which
card `current.card.append` goes to (customize=True), and the @card arguments."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest

from stoker import card, step
from stoker.cards import Markdown, MetaflowCard
from stoker.cards import card as card_mod
from stoker.cards.custom import CardTask, metaflow_components, render_custom
from stoker.cards.render import card_body_html
from stoker.cards.runtime import start_task_cards
from stoker.cards.store import list_cards
from stoker.errors import ConfigError
from stoker.flow.current import current
from stoker.store.artifacts import save_artifact
from stoker.store.blobs import open_store


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    """A fresh registry (and no cached `metaflow_extensions`) per test; `current` left as other tests expect."""
    monkeypatch.setattr(card_mod, "_registry", None)
    monkeypatch.setattr(card_mod, "_added", {})
    for name in [m for m in sys.modules if m == "metaflow_extensions" or m.startswith("metaflow_extensions.")]:
        monkeypatch.delitem(sys.modules, name)
    yield
    current._clear()


class Scores(MetaflowCard):
    type = "unit_scores"
    ALLOW_USER_COMPONENTS = True

    def __init__(self, options={}, components=[], graph=None, flow=None, **kw):  # noqa: B006
        self.options, self.components = options, components

    def render(self, task):
        return (f"<p>{self.options.get('title', '-')} {task.data.x} {task['x'].data} {self.components}"
                f" {self.RELOAD_POLICY_TOKEN}</p>")


def _write_ext(root, org, types):
    pkg = root / "metaflow_extensions" / org / "plugins" / "cards" / f"{org}_cards"
    pkg.mkdir(parents=True)
    body = "from stoker.cards import MetaflowCard\n"
    for t in types:
        body += f"class C_{t}(MetaflowCard):\n    type = {t!r}\n    def render(self, task):\n        return {t!r}\n"
    body += f"CARDS = [{', '.join('C_' + t for t in types)}, 'not a card']\n"
    (pkg / "__init__.py").write_text(body)


def test_metaflow_extensions_packages_on_sys_path_are_found(tmp_path, monkeypatch):
    _write_ext(tmp_path / "a", "org_a", ["t_one", "t_two"])
    _write_ext(tmp_path / "b", "org_b", ["t_two", "t_three"])  # a type already found is skipped, as in Metaflow
    monkeypatch.syspath_prepend(str(tmp_path / "b"))
    monkeypatch.syspath_prepend(str(tmp_path / "a"))
    types = card_mod.card_types(reload=True)
    assert sorted(types) == ["t_one", "t_three", "t_two"]
    assert types["t_two"].__module__ == "metaflow_extensions.org_a.plugins.cards.org_a_cards"
    assert card_mod.get_card_class("default") is None and card_mod.get_card_class("nope") is None


def test_the_stoker_cards_entry_point_group(tmp_path, monkeypatch):
    (tmp_path / "pkg_cards.py").write_text(textwrap.dedent("""
        from stoker.cards import MetaflowCard
        class EP(MetaflowCard):
            type = "ep_card"
            def render(self, task):
                return "ep"
        class Listed(MetaflowCard):
            type = "ep_listed"
        CARDS = [Listed]
    """))
    dist = tmp_path / "pkg_cards-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: pkg-cards\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[stoker.cards]\nep = pkg_cards:EP\nmod = pkg_cards\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert {"ep_card", "ep_listed"} <= set(card_mod.card_types(reload=True))


def test_register_card_refuses_what_is_not_a_card_type():
    assert card_mod.register_card(Scores) is Scores and card_mod.get_card_class("unit_scores") is Scores

    class NoType(MetaflowCard):
        pass

    class Builtin(MetaflowCard):
        type = "default"

    for bad in (NoType, Builtin, dict):
        with pytest.raises(TypeError):
            card_mod.register_card(bad)


def _task(tmp_path, **artifacts):
    store = open_store(str(tmp_path / "store"))
    descs = {k: save_artifact(store, v, name=k) for k, v in artifacts.items()}
    return CardTask("F/7/s/3", 0, store, descs, finished=True, successful=True)


def test_render_gets_metaflows_arguments_and_a_task_reading_artifacts(tmp_path):
    task = _task(tmp_path, x=41)
    out = render_custom("unit_scores", Scores, "render", task, {"render_seq": "final"}, {"title": "T"},
                        [{"type": "section"}], None, None, 5, True)
    assert out.html == "<p>T 41 41 [{'type': 'section'}] final</p>" and out.error is None
    assert task.pathspec == "F/7/s/3" and task.id == "3" and "x" in task and "y" not in task
    out = render_custom("unit_scores", Scores, "render", task, {}, None, [], None, None, None, True)
    assert out.html == "<p>- 41 41 [] never</p>"  # options={} is not passed, as Metaflow does


def test_failures_give_metaflows_error_card_or_nothing(tmp_path):
    class Broken(MetaflowCard):
        type = "broken"

        def render(self, task):
            raise ValueError("boom")

    class Slow(MetaflowCard):
        type = "slow"

        def render(self, task):
            time.sleep(3)
            return "late"

    class Empty(MetaflowCard):
        type = "empty"

        def render(self, task):
            return None

    class Args(MetaflowCard):
        type = "args"

        def __init__(self):
            pass

    task = _task(tmp_path)
    r = render_custom("broken", Broken, "render", task, {}, {"a": 1}, [], None, None, 5, True)
    assert r.html is None and "ValueError: boom" in r.error
    assert r.error.startswith("Card of type broken is unable to be rendered with arguments {'a': 1}.\nStack trace : "
                              " Traceback")
    r = render_custom("broken", Broken, "render", task, {}, None, [], None, None, 5, False)
    assert r.error is None and r.html is None and "ValueError: boom" in r.problem
    t0 = time.time()
    r = render_custom("slow", Slow, "render", task, {}, None, [], None, None, 0.3, True)
    assert time.time() - t0 < 2
    assert "Card rendering timed out after 0.3 seconds" in r.error and "time.sleep(3)" in r.error
    assert render_custom("empty", Empty, "render", task, {}, None, [], None, None, 5, True).error == \
        "No information rendered from card of type empty"
    assert render_custom("args", Args, "render", task, {}, {"x": 1}, [], None, None, 5, True).error == \
        "Card of type args cannot support arguments {'x': 1}"
    assert render_custom("gone", None, "render", task, {}, None, [], None, None, 5, True).error == \
        "MetaflowCard named gone not found. Check the `type` attribute in @card"


def test_components_reach_a_card_as_metaflow_serializes_them():
    got = metaflow_components([{"type": "markdown", "text": "# h"}, {"type": "markdown", "text": "p"},
                               {"type": "table", "headers": ["a"], "data": [[1]]}])
    assert [c.get("source") for c in got[0]["contents"][:2]] == ["# h", "\np"]
    assert got[0]["type"] == "section" and got[0]["contents"][2]["columns"] == ["a"]
    assert metaflow_components([]) == []


def _spec():
    return SimpleNamespace(flow="F", run_id="7", step="s", task_id="3", attempt=0, user="me", parallel=None,
                           run_inputs={})


def _func(*decos):
    def s(self):
        pass

    f = step(s)
    for d in decos:
        f = d(f)
    return f


def test_a_custom_card_in_a_task_customize_and_the_stored_card(tmp_path):
    card_mod.register_card(Scores)
    store = open_store(str(tmp_path / "store"))
    tc = start_task_cards(_func(card(type="unit_scores", id="mine", customize=True), card(type="blank")),
                          _spec(), store)
    current.card.append(Markdown("# to mine"))  # customize=True wins over the unnamed blank card
    tc.finish({"x": save_artifact(store, 5, name="x")}, {"status": "ok"})
    refs = {r.id: r for r in list_cards(store, "F", "7", "s", "3")}
    assert sorted(refs) == ["blank", "mine"]
    html = refs["mine"].html(store)
    assert html.startswith("<p>- 5 5 [{'type': 'section', 'contents': [{") and "'source': '# to mine'" in html
    assert html.endswith(" final</p>")
    data = refs["mine"].data(store)
    assert data["type"] == "unit_scores" and data["custom"] and data["html"] == html
    assert refs["blank"].data(store)["components"] == []
    body = card_body_html(data)  # the report and the UI: the card's own HTML in a sandbox, escaped
    assert '<iframe class="custom-card" sandbox=""' in body and "&lt;p&gt;- 5 5" in body


def test_a_failed_task_renders_no_custom_card_and_an_unknown_type_is_an_error_card(tmp_path, capsys):
    card_mod.register_card(Scores)
    store = open_store(str(tmp_path / "store"))
    tc = start_task_cards(_func(card(type="unit_scores", id="mine")), _spec(), store)
    tc.finish({}, {"status": "failed", "exception": {"type": "ValueError"}})
    assert list_cards(store, "F", "7", "s", "3") == []  # Metaflow renders cards only when the task succeeded
    tc = start_task_cards(_func(card(type="no_such_type", id="gone")), _spec(), store)
    assert "no card type 'no_such_type'" in capsys.readouterr().out
    current.card.append(Markdown("dropped"))  # not editable: Metaflow warns and drops it
    tc.finish({}, {"status": "ok"})
    (ref,) = list_cards(store, "F", "7", "s", "3")
    data = ref.data(store)
    assert data["type"] == "no_such_type" and data["error_card"] and data["title"] == "Error Card"
    assert "MetaflowCard named no_such_type not found" in json.dumps(data)
    assert "Card Render Failed With Error" in ref.html(store)


def test_card_arguments():
    card(type="any_custom_type", customize=True, save_errors=False, timeout=1, rank="high", scope="task")
    for bad in ({"type": "has-dash"}, {"type": 3}, {"timeout": "soon"}, {"timeout": True}):
        with pytest.raises(ConfigError):
            card(**bad)(lambda self: None)
