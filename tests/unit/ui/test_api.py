"""The UI's JSON API through Starlette's TestClient, over a real store folder and a real SQLite index filled
the way the scheduler fills them (manifests written to the store, then ingested)."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")

from starlette.testclient import TestClient  # noqa: E402

from stoker.store.artifacts import save_artifact  # noqa: E402
from stoker.store.blobs import LocalBlobStore  # noqa: E402
from stoker.store.manifest import log_name, write_manifest  # noqa: E402
from stoker.store.metadata import MetadataDB  # noqa: E402
from stoker.store.series import SeriesWriter, series_prefix  # noqa: E402
from stoker.ui.app import create_app, is_loopback  # noqa: E402

FLOW, RUN = "UiFlow", "1700000000000001"


def _task(store, db, step, task_id, *, status="ok", artifacts=None, exc=None, parallel=None, inputs=(), log=b""):
    now = time.time()
    m = {"flow": FLOW, "run_id": RUN, "step": step, "task_id": task_id, "attempt": 0, "status": status,
         "started_at": now - 2, "finished_at": now, "user": "tester", "hostname": "h1",
         "artifacts": {k: save_artifact(store, v) for k, v in (artifacts or {}).items()},
         "exception": exc, "parallel": parallel, "input_paths": list(inputs),
         "logs": {"stdout": log_name(FLOW, RUN, step, task_id, 0, "stdout")}}
    store.write(log_name(FLOW, RUN, step, task_id, 0, "stdout"), log)
    write_manifest(store, m)
    db.ingest_manifest(m)


@pytest.fixture()
def ui(tmp_path):
    store = LocalBlobStore(tmp_path / "store")
    db = MetadataDB(tmp_path / "metadata.db")
    (tmp_path / "secret.txt").write_text("TOP SECRET")
    db.create_run(FLOW, RUN, user="tester", tags=["exp1"], params={"n": 3})
    _task(store, db, "start", "1", artifacts={"n": 3, "big": list(range(5000))}, log=b"hello from start\n")
    for node in (0, 1):
        exc = ({"type": "RuntimeError", "message": "rank 1 exploded", "traceback": "Traceback ...\nRuntimeError"}
               if node == 1 else {"type": "TaskDied", "message": "task process killed by signal SIGTERM because gang",
                                  "traceback": ""})
        _task(store, db, "train", str(2 + node), status="failed", exc=exc, inputs=[f"{FLOW}/{RUN}/start/1"],
              parallel={"node_index": node, "num_nodes": 2}, log=f"node {node} log\n".encode())
    db.set_run_status(FLOW, RUN, "failed")
    w = SeriesWriter(store, series_prefix("metrics", FLOW, RUN, "train", "2", 0), interval=60)
    for i in range(7):
        w.add({"step": i, "loss": 5.0 - i * 0.1, "lr": 1e-3, "tokens_per_s": 1000.0, "mfu": 0.1})
    w.close()
    mon = SeriesWriter(store, series_prefix("monitor", FLOW, RUN, "train", "3", 0, node=1), interval=60)
    mon.add({"node": 1, "cpu_percent": 50.0, "rss_mb": 100.0, "gpus": [{"index": 0, "util": 90, "mem_used_mb": 10}]})
    mon.close()
    store.write(f"runs/{FLOW}/{RUN}/cards/start/1/0/default.html", b"<html><body>my card</body></html>")
    store.write(f"runs/{FLOW}/{RUN}/cards/start/1/0/default.json", b'{"id": "default", "title": "Start card"}')
    app = create_app(store=store, db=db, home=tmp_path / "home")
    with TestClient(app) as client:
        yield client


def test_runs_list_shape_and_filters(ui):
    d = ui.get("/api/runs").json()
    assert d["flows"] == [FLOW]
    (r,) = d["runs"]
    assert {"flow", "run_id", "status", "user", "created_at", "finished_at", "duration", "tags"} <= set(r)
    assert (r["run_id"], r["status"], r["user"], r["tags"]) == (RUN, "failed", "tester", ["exp1"])
    assert ui.get("/api/runs?status=succeeded").json()["runs"] == []
    assert len(ui.get("/api/runs?tag=exp1").json()["runs"]) == 1
    assert ui.get("/api/runs?tag=nope").json()["runs"] == []
    assert ui.get("/api/runs?flow=Other").json()["runs"] == []
    assert ui.get("/api/runs?status=bogus").status_code == 400


def test_run_detail_dag_tasks_and_first_failing_node(ui):
    d = ui.get(f"/api/runs/{FLOW}/{RUN}").json()
    assert d["run"]["status"] == "failed" and d["params"] == {"n": 3}
    assert {n["name"]: n["state"] for n in d["dag"]["nodes"]} == {"start": "ok", "train": "failed"}
    assert d["dag"]["edges"] == [["start", "train"]]
    tasks = {(t["step"], t["task_id"]): t for t in d["tasks"]}
    assert tasks[("train", "3")]["node"] == 1 and tasks[("train", "3")]["attempts"][0]["duration"] > 0
    f = d["failure"]  # node 1 failed on its own; node 0 was stopped because of it, even if it finished first
    assert (f["step"], f["task_id"], f["node"], f["type"]) == ("train", "3", 1, "RuntimeError")


def test_logs_offset_and_download(ui):
    url = f"/api/runs/{FLOW}/{RUN}/tasks/train/3/logs/0/stdout"
    d = ui.get(url).json()
    assert d == {"text": "node 1 log\n", "offset": 11, "size": 11, "final": True, "reset": False}
    assert ui.get(url + "?offset=5").json()["text"] == "1 log\n"
    assert ui.get(url + "?offset=99").json()["reset"] is True
    r = ui.get(url + "/download")
    assert r.text == "node 1 log\n" and "attachment" in r.headers["content-disposition"]


def test_series_artifacts_cards(ui):
    (m,) = ui.get(f"/api/runs/{FLOW}/{RUN}/series/metrics").json()["series"]
    assert (m["step"], m["task_id"], m["attempt"], m["node"]) == ("train", "2", 0, None)
    assert [r["step"] for r in m["records"]] == list(range(7))
    (mon,) = ui.get(f"/api/runs/{FLOW}/{RUN}/series/monitor").json()["series"]
    assert mon["node"] == 1 and mon["records"][0]["gpus"][0]["util"] == 90
    arts = {a["name"]: a for a in ui.get(f"/api/runs/{FLOW}/{RUN}/tasks/start/1/artifacts").json()["artifacts"]}
    assert arts["n"]["preview"] == "3" and arts["n"]["type"] == "int"
    assert len(arts["big"]["preview"]) < 200  # a large value shows its short stored repr, not the value
    (c,) = ui.get(f"/api/runs/{FLOW}/{RUN}/cards").json()["cards"]
    assert c["title"] == "Start card"
    card = ui.get(c["url"])
    assert "my card" in card.text and "sandbox" in card.headers["content-security-policy"]
    assert ui.get(f"/api/runs/{FLOW}/{RUN}/pipeline").json() == {"pipeline": None}


@pytest.mark.parametrize("url", [
    "/api/runs/Nope/1", f"/api/runs/{FLOW}/999", f"/api/runs/{FLOW}/{RUN}/tasks/nostep/1/artifacts",
    f"/api/runs/{FLOW}/{RUN}/tasks/train/99/logs/0/stdout", f"/api/runs/{FLOW}/{RUN}/tasks/train/2/logs/5/stdout",
    f"/api/runs/{FLOW}/{RUN}/tasks/train/2/logs/0/other", f"/api/runs/{FLOW}/{RUN}/series/secrets",
    f"/api/runs/{FLOW}/{RUN}/cards/start/1/0/missing", "/runs/Nope/1",
])
def test_unknown_things_are_404(ui, url):
    assert ui.get(url).status_code == 404


@pytest.mark.parametrize("path", [
    "/api/runs/..%2f..%2fsecret.txt/x", "/api/runs/%2e%2e/%2e%2e", f"/api/runs/{FLOW}/..%2F..%2F..%2Fsecret.txt",
    f"/api/runs/{FLOW}/{RUN}/tasks/..%5c..%5c/x/logs/0/stdout",
    f"/api/runs/{FLOW}/{RUN}/tasks/%2Fetc%2Fpasswd/1/artifacts",
    f"/api/runs/{FLOW}/{RUN}/tasks/start/..%2f..%2f..%2f..%2fsecret.txt/logs/0/stdout",
    f"/api/runs/{FLOW}/{RUN}/cards/..%2f..%2f/1/0/default",
    f"/api/runs/{FLOW}/{RUN}/cards/start/1/0/..%2f..%2f..%2fsecret",
    "/static/..%2f..%2f..%2f..%2fsecret.txt", "/static/%2e%2e/app.py", "/static//etc/passwd", "/static/..\\app.py",
    "/runs/%2e%2e/%2e%2e", "/api/runs/%2Fetc/passwd", "//etc/passwd", "/api/runs/C:%5cWindows/x",
])
def test_no_path_outside_the_store(ui, path):
    r = ui.get(path)
    assert r.status_code in (400, 404), (path, r.status_code)
    assert "TOP SECRET" not in r.text and "root:" not in r.text and "create_app" not in r.text


def test_static_files_served(ui):
    assert "StokerChart" in ui.get("/static/chart.js").text


def test_pages_render(ui):
    assert f'data-run="{FLOW}/{RUN}"' in ui.get("/").text
    page = ui.get(f"/runs/{FLOW}/{RUN}").text
    assert 'data-step="start"' in page and 'data-step="train"' in page


def test_token_required_when_set(tmp_path):
    store, db = LocalBlobStore(tmp_path / "s"), MetadataDB(tmp_path / "m.db")
    with TestClient(create_app(store=store, db=db, token="s3cret")) as c:
        assert c.get("/api/runs").status_code == 401
        assert c.get("/").status_code == 401
        assert c.get("/static/chart.js").status_code == 401
        assert c.get("/api/runs?token=wrong").status_code == 401
        assert c.get("/api/runs", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/api/runs", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        r = c.get("/?token=s3cret")  # the query sets a cookie, so the page's own requests carry the token
        assert r.status_code == 200 and "stoker_ui_token" in r.headers["set-cookie"]
        assert c.get("/api/runs").status_code == 200
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5")


def test_cli_non_loopback_generates_a_token(tmp_path, monkeypatch, capsys):
    """`stoker ui --host 0.0.0.0` without --token makes one and passes it to the app (uvicorn.run replaced by a
    recorder: a real server is started in the browser test)."""
    import uvicorn

    from stoker.cli import ui as cli_ui

    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(app=app, **kw))
    args = cli_ui.argparse.Namespace(host="0.0.0.0", port=9999, token=None)
    cli_ui.cmd_ui(args)
    out = capsys.readouterr().out
    token = out.split("?token=")[1].split()[0]
    assert len(token) >= 24 and seen["host"] == "0.0.0.0"
    with TestClient(seen["app"]) as c:
        assert c.get("/api/runs").status_code == 401
        assert c.get(f"/api/runs?token={token}").status_code == 200


def test_pipeline_results(tmp_path):
    """LlamaPretrain's artifacts (eval, export_dir, checkpoint) and its committed checkpoints in the store."""
    store, db = LocalBlobStore(tmp_path / "s"), MetadataDB(tmp_path / "m.db")
    db.create_run(FLOW, RUN, user="tester", params={})
    ev = {"val_loss": 2.5, "val_perplexity": 12.2, "samples": [{"prompt": "To be", "completion": " or not"}]}
    _task(store, db, "join", "4", artifacts={"checkpoint": f"{store.url}/checkpoints/{FLOW}/{RUN}"})
    _task(store, db, "evaluate", "5", artifacts={"eval": ev})
    _task(store, db, "export", "6", artifacts={"export_dir": "/exports/x"})
    for s in ("step_00000010", "step_00000020"):
        store.write(f"checkpoints/{FLOW}/{RUN}/{s}/manifest.json", b"{}")
    store.write(f"checkpoints/{FLOW}/{RUN}/.tmp-step_00000030/x", b"")  # never committed: not listed
    store.write(f"checkpoints/{FLOW}/{RUN}/latest", b"step_00000020")
    with TestClient(create_app(store=store, db=db)) as c:
        p = c.get(f"/api/runs/{FLOW}/{RUN}/pipeline").json()["pipeline"]
    assert p["eval"] == {"val_loss": 2.5, "val_perplexity": 12.2}
    assert p["samples"] == ev["samples"] and p["export_dir"] == "/exports/x"
    assert p["checkpoints"]["steps"] == ["step_00000010", "step_00000020"]
    assert p["checkpoints"]["latest"] == "step_00000020"


def test_a_running_attempt_not_yet_indexed_shows_with_its_live_log(tmp_path):
    """The scheduler indexes an attempt when it ends: while it runs, the UI finds it from its log (the local log
    file under $STOKER_HOME/logs, or a remote task's chunks in the store) and tails it."""
    store, db, home = LocalBlobStore(tmp_path / "s"), MetadataDB(tmp_path / "m.db"), tmp_path / "home"
    db.create_run(FLOW, RUN, user="tester", params={})
    _task(store, db, "start", "1")
    local = home / "logs" / FLOW / RUN / "train" / "2.0"
    local.mkdir(parents=True)
    (local / "stdout.log").write_bytes(b"step 1\nstep 2\n")
    remote = log_name(FLOW, RUN, "train", "3", 0, "stdout") + ".parts/"
    store.write(remote + "000000", b"node 1 part a\n")
    store.write(remote + "000001", b"node 1 part b\n")
    with TestClient(create_app(store=store, db=db, home=home)) as c:
        d = c.get(f"/api/runs/{FLOW}/{RUN}").json()
        running = {t["task_id"]: t for t in d["tasks"] if t["status"] == "running"}
        assert set(running) == {"2", "3"} and d["steps"][0]["name"] == "start"
        assert {n["name"]: n["state"] for n in d["dag"]["nodes"]}["train"] == "running"
        log = c.get(f"/api/runs/{FLOW}/{RUN}/tasks/train/2/logs/0/stdout").json()
        assert (log["text"], log["final"]) == ("step 1\nstep 2\n", False)
        assert c.get(f"/api/runs/{FLOW}/{RUN}/tasks/train/3/logs/0/stdout").json()["text"] == \
            "node 1 part a\nnode 1 part b\n"
        assert c.get(f"/api/runs/{FLOW}/{RUN}/tasks/train/9/logs/0/stdout").status_code == 404
        db.set_run_status(FLOW, RUN, "failed")  # a finished run lists only what the index has
        assert [t["task_id"] for t in c.get(f"/api/runs/{FLOW}/{RUN}").json()["tasks"]] == ["1"]
