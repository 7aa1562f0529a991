"""Custom card types: a MetaflowCard subclass registered in a `metaflow_extensions` package beside the flow."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.compat.conftest import compare, outputs
from tests.compat.engines import ENGINES, FLOWS, run_flow

pytestmark = pytest.mark.slow

EXT = FLOWS / "card_ext"
# the card package sits beside the flow, as a Metaflow user keeps one in a project
FILES = {str(p.relative_to(EXT)): p.read_text() for p in sorted(EXT.rglob("*.py"))}

# Metaflow's card writer puts local cards under the working directory's .metaflow while its client looks under
# the datastore root: for Metaflow the run's home is the flow's folder, so that both are the same place
_CARDS_HELPER = """
import base64, html, re
from metaflow import Flow
from metaflow.cards import get_cards

def text(h):  # Metaflow's error card keeps its content base64-encoded in the page
    for b in re.findall(r'__MF_DATA__\\[[^\\]]*\\] = "([A-Za-z0-9+/=]+)"', h):
        h += base64.b64decode(b).decode()
    return html.unescape(h)

def cards(step):
    task = Flow("CustomCardFlow").latest_run[step].task
    return sorted([c.id, c.type, text(c.get())] for c in get_cards(task))
"""


@pytest.fixture(scope="module")
def runs(engines, tmp_path_factory):
    base = tmp_path_factory.mktemp("compat")
    return {name: run_flow(engines[name], "custom_card_flow.py", base / name, files=FILES,
                           home=base / name if name == "metaflow" else None) for name in ENGINES}


def test_flow_runs(runs, request):
    """A flow whose cards fail, time out or do not exist still succeeds."""
    compare(request, "exit status", {n: r.proc.returncode for n, r in runs.items()}, 0)
    assert all(r.ok for r in runs.values()), outputs(runs)


def test_custom_card_html(runs, request):
    """render(task) reads artifacts; options, components (to the customize=True card), graph and token arrive.

    Options are passed only when not empty, components as Metaflow serializes them (one section), the reload
    token of a final render is "final"."""
    got = {n: r.client(_CARDS_HELPER + "result = cards('start')") for n, r in runs.items()}
    comps = "components=[['section', ['# to the customize=True card', '\\nsecond']]]"
    want = [["custom", "compat_report", "<html><body><h1>untitled</h1><p>step=start flow=CustomCardFlow</p>"
             "<p>scores=[('a', 1), ('b', 2)] via_item=1</p><p>" + comps + "</p>"
             "<p>graph=['end', 'middle', 'start']</p><p>token=final</p></body></html>"],
            ["report", "compat_report", "<html><body><h1>Scores</h1><p>step=start flow=CustomCardFlow</p>"
             "<p>scores=[('a', 1), ('b', 2)] via_item=1</p><p>components=[['section', ['\\nto report']]]</p>"
             "<p>graph=['end', 'middle', 'start']</p><p>token=final</p></body></html>"]]
    compare(request, "[id, type, HTML] of the start step's two custom cards", got, want)


def test_runtime_card_gets_refresh_data(runs, request):
    """A RUNTIME_UPDATABLE card's final render sees the last `current.card[id].refresh(data)` in runtime_data."""
    got = {n: r.client(_CARDS_HELPER + "result = cards('middle')") for n, r in runs.items()}
    compare(request, "[id, type, HTML] of the runtime card", got,
            [["live", "compat_live", "<p>final user={'n': 3} seq=final mode=render</p>"]])


def test_errors_and_time_limits(runs, request):
    """A render that raises, runs past `timeout` or returns nothing, and an unknown type, give the error card.

    With save_errors (the default) Metaflow's error card is stored under the card's type and id;
    save_errors=False stores nothing and logs the failure."""
    got = {n: r.client(_CARDS_HELPER + """
why = {"broken": "ZeroDivisionError: the card's own bug",
       "slow": "Card rendering timed out after 1 seconds",
       "empty": "No information rendered from card of type compat_empty",
       "missing": "MetaflowCard named compat_missing not found. Check the `type` attribute in @card"}
result = [[cid, ctype, "Card Render Failed With Error" in t, why.get(cid, "?") in t] for cid, ctype, t in cards("end")]
""") for n, r in runs.items()}
    compare(request, "[id, type, is an error card, says why] of the end step's cards", got,
            [["broken", "compat_broken", True, True], ["empty", "compat_empty", True, True],
             ["missing", "compat_missing", True, True], ["slow", "compat_slow", True, True]])
    for r in runs.values():  # save_errors=False: the failure is in the task's log
        assert "Card of type compat_broken is unable to be rendered with arguments None" in r.output, outputs(runs)


def test_stoker_card_view_finds_a_custom_card(runs):
    """`stoker card view --print` writes the custom card's own HTML (stoker only: Metaflow's CLI differs)."""
    import subprocess
    import sys

    r = runs["stoker"]
    run_id = r.client("from metaflow import Flow\nresult = Flow('CustomCardFlow').latest_run.id")
    cli = [sys.executable, "-c", "from stoker.cli.main import main; main()"]
    proc = subprocess.run([*cli, "card", "view", f"CustomCardFlow/{run_id}/start", "--id", "report", "--print"],
                          cwd=r.folder, capture_output=True, text=True, env=r.engine.env(r.home), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    path = Path(proc.stdout.strip().splitlines()[-1].split()[-1])
    assert "<h1>Scores</h1>" in path.read_text()
