"""Cards end to end: a real flow with @card, live refreshes read from the store while the step runs, the final
cards, `stoker card view --print`, `stoker report -o`, and the monitor card.

The card flow is written as a Metaflow user writes it (`from metaflow import ...`, `from metaflow.cards import
...`); the test changes only those import lines to `stoker`. Inside its first step it also streams training
metrics into the store with stoker's SeriesWriter, as the trainer's rank 0 does, so the report has a loss chart.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

CARD_FLOW = '''
import os
import struct
import time
import zlib

from metaflow import FlowSpec, Parameter, card, current, step
from metaflow.cards import Artifact, Image, Markdown, ProgressBar, Table, VegaChart


def tiny_png():
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\\x00\\xff\\x00\\x00")) + chunk(b"IEND", b""))


class CardFlow(FlowSpec):
    go_file = Parameter("go_file", default="")
    steps = Parameter("steps", default=12, type=int)

    @card(type="blank", id="live", refresh_interval=0.2)
    @card
    @step
    def start(self):
        from stoker.store.blobs import open_store                     # what the trainer's rank 0 does
        from stoker.store.series import SeriesWriter, series_prefix

        bar = ProgressBar(max=self.steps, label="training steps")
        note = Markdown("# Training <script>alert(1)</script>")
        current.card["live"].append(note)
        current.card["live"].append(bar)
        current.card["live"].append(Table([["<script>evil()</script>", 1]], headers=["who", "n"]))
        current.card.append(Markdown("user text in the default card"))
        current.card.append(Image(tiny_png(), label="a pixel"))
        metrics = SeriesWriter(open_store(current.store_url),
                               series_prefix("metrics", current.flow_name, current.run_id, current.step_name,
                                             current.task_id, current.retry_count), interval=0.2)
        losses = []
        for i in range(self.steps):
            losses.append({"step": i, "loss": 4.0 / (i + 1)})
            metrics.add({"step": i, "loss": 4.0 / (i + 1), "lr": 1e-3, "tokens_per_s": 1000.0 + i})
            bar.update(i + 1)
            current.card["live"].refresh()
        metrics.close()
        current.card["live"].append(VegaChart({"title": "card loss", "mark": "line", "data": {"values": losses},
                                               "encoding": {"x": {"field": "step", "type": "quantitative"},
                                                            "y": {"field": "loss", "type": "quantitative"}}}))
        note.update("# Waiting for the test")
        current.card.refresh(force=True)
        if self.go_file:  # the test reads the live card from the store, then lets the step end
            deadline = time.time() + 90
            while not os.path.exists(self.go_file):
                if time.time() > deadline:
                    raise RuntimeError("the test never created the go file")
                time.sleep(0.05)
        self.table = {"rows": 3}
        self.loss = losses[-1]["loss"]
        self.next(self.boom)

    @card(type="blank")
    @step
    def boom(self):
        current.card.append(Artifact({"before": "the error"}, name="state"))
        print("about to fail: line one", flush=True)
        raise ValueError("a card survives this failure")
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    CardFlow()
'''

MONITOR_FLOW = '''
import time

from stoker import FlowSpec, card, current, monitor, step
from stoker.cards import Markdown


class MonitoredFlow(FlowSpec):
    @monitor(interval=0.1)
    @card(type="blank")
    @step
    def start(self):
        current.card.append(Markdown("busy"))
        end = time.time() + 1.5
        while time.time() < end:
            sum(i * i for i in range(10000))
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    MonitoredFlow()
'''

CLI = ("import argparse, sys\n"
       "from stoker.cli.cards import register\n"
       "from stoker.cli.errors import run_cli\n"
       "ap = argparse.ArgumentParser(prog='stoker'); sub = ap.add_subparsers(dest='command', required=True)\n"
       "register(sub); a = ap.parse_args(sys.argv[1:]); run_cli(lambda: a.fn(a))\n")


def _env(home: Path) -> dict[str, str]:
    env = {**os.environ, "STOKER_HOME": str(home)}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("STOKER_STORE", None)
    return env


def stoker_cli(home: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`stoker card ...` / `stoker report ...` (through main when it registers them, else through cli/cards.py)."""
    from stoker.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if getattr(a, "choices", None) and "runs" in a.choices)
    cmd = ([sys.executable, "-m", "stoker.cli.main"] if "report" in sub.choices else [sys.executable, "-c", CLI])
    return subprocess.run([*cmd, *args], cwd=cwd, env=_env(home), capture_output=True, text=True, timeout=120)


def metaflow_to_stoker(text: str) -> str:
    """The import change a Metaflow user makes: `from metaflow...` lines become `from stoker...`; nothing else."""
    lines = text.splitlines(keepends=True)
    out = [ln.replace("from metaflow", "from stoker", 1) if ln.startswith("from metaflow") else ln for ln in lines]
    assert sum(a != b for a, b in zip(lines, out, strict=True)) == 2
    return "".join(out)


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def tags_of(text: str) -> list[tuple[str, dict]]:
    p = _Tags()
    p.feed(text)
    return p.tags


def _wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = predicate()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the flow ended (rc {proc.returncode}) before {what}\n{out[-3000:]}\n{err[-3000:]}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def card_run(tmp_path_factory):
    """Run CardFlow once; while its start step waits, capture its live card from the store."""
    folder = tmp_path_factory.mktemp("cards")
    home = folder / "home"
    flow = folder / "card_flow.py"
    flow.write_text(metaflow_to_stoker(CARD_FLOW))
    go = folder / "go"
    proc = subprocess.Popen([sys.executable, str(flow), "run", "--go_file", str(go)], cwd=folder, env=_env(home),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runs = home / "store" / "runs" / "CardFlow"

    def live_card():
        for p in runs.glob("*/cards/start/*/0/live.json"):
            data = json.loads(p.read_text())
            if any(c.get("type") == "vega" for c in data["components"]):
                return p, data
        return None

    try:
        live_path, live = _wait_for(live_card, 90, "the live card in the store", proc)
        manifests = list(runs.glob("*/start/*/0/manifest.json"))
        go.write_text("go")
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    run_id = live_path.relative_to(runs).parts[0]
    task_id = live_path.relative_to(runs).parts[3]
    return {"home": home, "folder": folder, "run_id": run_id, "task_id": task_id, "live": live,
            "manifests_while_live": manifests, "rc": proc.returncode, "out": out + err,
            "cards": runs / run_id / "cards"}


def test_live_card_is_in_the_store_before_the_step_ends(card_run):
    live = card_run["live"]
    assert card_run["manifests_while_live"] == [], "the live card must land while the step still runs"
    assert live["final"] is False and live["id"] == "live" and live["type"] == "blank"
    bar = next(c for c in live["components"] if c["type"] == "progress")
    assert bar["value"] == bar["max"] == 12  # updated and refreshed mid-step
    md = next(c for c in live["components"] if c["type"] == "markdown")
    assert md["text"] == "# Waiting for the test"  # Markdown.update() reached the store
    html = (card_run["cards"] / "start" / card_run["task_id"] / "0" / "live.html").read_text()
    assert "<svg" in html and 'data-points="12"' in html


def test_final_cards_of_a_successful_and_of_a_failed_step(card_run):
    assert card_run["rc"] != 0, "the boom step fails, so the run fails"
    start = card_run["cards"] / "start" / card_run["task_id"] / "0"
    assert sorted(p.name for p in start.iterdir()) == ["default.html", "default.json", "live.html", "live.json"]
    live = json.loads((start / "live.json").read_text())
    assert live["final"] is True
    default = json.loads((start / "default.json").read_text())
    assert default["final"] is True and default["type"] == "default"
    text = json.dumps(default)
    assert "user text in the default card" in text and "data:image/png;base64," in text
    arts = next(c for c in default["components"] if c["type"] == "table" and c["headers"][:2] == ["name", "type"]
                and any(r[0] == "loss" for r in c["data"]))
    row = next(r for r in arts["data"] if r[0] == "loss")
    assert row[1] == "float" and row[3] == "0.3333333333333333"  # name, type, size, preview
    html = (start / "default.html").read_text()
    assert all(t not in ("script", "link", "iframe") for t, _ in tags_of(html))
    boom_dir = next((card_run["cards"] / "boom").iterdir()) / "0"
    boom = json.loads((boom_dir / "blank.json").read_text())
    assert boom["final"] is True and any(c["type"] == "artifact" and c["name"] == "state" for c in boom["components"])


def test_card_view_print_writes_the_card_html(card_run):
    spec = f"CardFlow/{card_run['run_id']}/start"
    p = stoker_cli(card_run["home"], "card", "view", spec, "--print", "--id", "live", cwd=card_run["folder"])
    assert p.returncode == 0, p.stderr
    path = Path(p.stdout.strip().splitlines()[-1])
    page = path.read_text()
    stored = (card_run["cards"] / "start" / card_run["task_id"] / "0" / "live.html").read_text()
    assert page == stored and "Waiting for the test" in page
    path.unlink()
    p = stoker_cli(card_run["home"], "card", "view", f"{spec}/{card_run['task_id']}", "--print",
                   cwd=card_run["folder"])
    assert p.returncode == 0 and "showing default" in p.stderr
    assert "user text in the default card" in Path(p.stdout.strip().splitlines()[-1]).read_text()
    p = stoker_cli(card_run["home"], "card", "view", f"CardFlow/{card_run['run_id']}/end", "--print",
                   cwd=card_run["folder"])
    assert p.returncode != 0 and "has no cards" in p.stderr and "@card" in p.stderr and "Traceback" not in p.stderr


def test_report_is_one_offline_file_with_steps_charts_failures_and_cards(card_run, tmp_path):
    out = tmp_path / "report.html"
    p = stoker_cli(card_run["home"], "report", f"CardFlow/{card_run['run_id']}", "-o", str(out), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["report.html"]
    page = out.read_text()
    tags = tags_of(page)
    assert not [t for t, _ in tags if t in ("script", "link", "iframe", "object", "embed")]
    assert "<script src=" not in page and "<link href=" not in page
    for tag, attrs in tags:
        for key in ("src", "href"):
            assert not re.match(r"^(https?:)?//", attrs.get(key) or ""), f"<{tag} {key}={attrs[key]}> is remote"
    for step_name in ("start", "boom"):
        assert f"<td>{step_name}</td>" in page
    assert "Training metrics" in page and "loss (start/" in page
    assert 'data-points="12"' in page  # the loss chart has one point per logged step
    assert "a card survives this failure" in page and "about to fail: line one" in page  # failure + log tail
    assert "user text in the default card" in page and "card live" in page  # cards embedded
    assert "&lt;script&gt;evil()&lt;/script&gt;" in page
    p = stoker_cli(card_run["home"], "report", f"CardFlow/{card_run['run_id']}/nope", "-o", str(out), cwd=tmp_path)
    assert p.returncode != 0 and "no step 'nope'" in p.stderr


def test_monitor_card_from_a_real_monitored_step(tmp_path):
    """@monitor samples this machine's CPU (psutil; no GPU or Neuron here); the task's end writes the monitor card."""
    home = tmp_path / "home"
    flow = tmp_path / "monitored_flow.py"
    flow.write_text(MONITOR_FLOW)
    p = subprocess.run([sys.executable, str(flow), "run"], cwd=tmp_path, env=_env(home), capture_output=True,
                       text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    found = list((home / "store" / "runs" / "MonitoredFlow").glob("*/cards/start/*/0/monitor.json"))
    assert len(found) == 1, "the @monitor step must have a monitor card"
    card = json.loads(found[0].read_text())
    assert card["final"] is True
    peaks = next(c for c in card["components"] if c["type"] == "table")
    assert (peaks["headers"][:3] == ["node", "device", "peak utilisation"]
            and peaks["data"][0][1] == "CPU (process tree)")
    charts = [c for c in card["components"] if c["type"] == "vega"]
    assert charts and len(charts[0]["spec"]["data"]["values"]) >= 5
    assert "<polyline" in found[0].with_suffix(".html").read_text()
    run_id = found[0].relative_to(home / "store" / "runs" / "MonitoredFlow").parts[0]
    out = tmp_path / "r.html"
    p = stoker_cli(home, "report", f"MonitoredFlow/{run_id}", "-o", str(out), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "<h2>Monitor</h2>" in out.read_text() and "Peak utilisation" in out.read_text()


def test_monitor_card_of_recorded_gpu_and_neuron_samples(tmp_path):
    """No GPU or Neuron device here: samples in the documented series format are written to a real local store
    with SeriesWriter (two gang nodes), and the monitor card is built from the store."""
    from stoker.cards.monitor_card import write_monitor_card
    from stoker.store.blobs import open_store
    from stoker.store.series import SeriesWriter, series_prefix

    store = open_store(str(tmp_path / "store"))
    for node in (0, 1):
        w = SeriesWriter(store, series_prefix("monitor", "F", "1", "train", "3", 0, node=node), interval=60)
        for i in range(20):
            w.add({"time": 1000.0 + i, "node": node, "cpu_percent": 50.0 + i, "rss_mb": 100.0 + i,
                   "host_mem_used_mb": 2000.0, "host_mem_total_mb": 8000.0,
                   "gpus": [{"index": 0, "util": 10.0 * (i % 10), "mem_used_mb": 1000.0 + i, "mem_total_mb": 4000.0,
                             "power_w": 100.0, "temp_c": 50.0}],
                   "neuron": {"cores": [{"index": c, "util": 5.0 * c + i} for c in range(2)],
                              "device_mem_used_mb": 300.0 + i, "host_mem_used_mb": 50.0, "vcpu_util": 12.0}})
        w.close()
    card = write_monitor_card(store, "F", "1", "train", "3", 0, final=True)
    peaks = next(c for c in card["components"] if c["type"] == "table")["data"]
    devices = [(r[0], r[1]) for r in peaks]
    for node in (0, 1):
        for dev in ("CPU (process tree)", "GPU 0", "NeuronCore 0", "NeuronCore 1", "Neuron device memory"):
            assert (node, dev) in devices
    gpu = next(r for r in peaks if r[:2] == [0, "GPU 0"])
    assert gpu[2] == "90.0%" and gpu[3] == "1019.0 MB of 4000 MB"
    core1 = next(r for r in peaks if r[:2] == [1, "NeuronCore 1"])
    assert core1[2] == "24.0%"
    page = store.read("runs/F/1/cards/train/3/0/monitor.html").decode()
    assert page.count("<svg") == sum(c["type"] == "vega" for c in card["components"]) == 2 * 6
    assert "NeuronCore 1 utilisation" in page and "<script" not in page
