"""`stoker ui` in a real headless browser: Debian's chromium driven by selenium, a real uvicorn server over a
real store and index, and real runs of tests/flows/ui_flow.py started in the background. Screenshots go to
$STOKER_TEST_ARTIFACTS (default tests/artifacts/)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import FLOWS, ROOT, run_flow

pytestmark = pytest.mark.slow

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
STEPS = 24  # train logs one loss point per step, 0.5 s apart: long enough to reload the page mid-run


def _missing() -> str | None:
    for path in (CHROMIUM, DRIVER):
        if not os.path.exists(path):
            return f"{path} is missing: apt-get install chromium chromium-driver (`make test` does it as root)"
    try:
        import selenium  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        return f"{e.name} is missing: pip install -e '.[dev]'"
    return None


@pytest.fixture()
def browser():
    if reason := _missing():
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser tests: {reason}", pytrace=False)
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,2400"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield driver
    driver.quit()


@pytest.fixture()
def ui_server(_stoker_home):
    """`stoker ui`'s app served by uvicorn on a free loopback port, in a thread of this process."""
    import uvicorn

    from stoker.store.blobs import open_store
    from stoker.store.metadata import MetadataDB
    from stoker.store.paths import default_db_path
    from stoker.ui.app import create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = create_app(store=open_store(), db=MetadataDB(default_db_path()), allowed_hosts=["127.0.0.1"])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@pytest.fixture()
def shots():
    folder = Path(os.environ.get("STOKER_TEST_ARTIFACTS") or ROOT / "tests" / "artifacts") / "ui"
    folder.mkdir(parents=True, exist_ok=True)
    saved: list[Path] = []

    def shot(driver, name: str) -> Path:
        path = folder / f"{name}.png"
        driver.save_screenshot(str(path))
        saved.append(path)
        print(f"screenshot: {path}")
        return path

    yield shot
    print("screenshots:\n  " + "\n  ".join(str(p) for p in saved))


def _wait(what: str, fn, timeout: float = 60, every: float = 0.25):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            last = fn()
        except Exception as e:  # noqa: BLE001 - an element not there yet
            last = e
        else:
            if last:
                return last
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def _points(driver) -> int:
    return int(driver.find_element("id", "chart-loss").get_attribute("data-points") or 0)


def test_ui_shows_a_live_run_and_a_failed_one(browser, ui_server, shots, tmp_path):
    from stoker.store.metadata import MetadataDB
    from stoker.store.paths import default_db_path

    proc = subprocess.Popen([sys.executable, str(FLOWS / "ui_flow.py"), "run", "--steps", str(STEPS)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ.copy())
    try:
        db = MetadataDB(default_db_path())
        run = _wait("the run to be indexed", lambda: db.list_runs("UiFlow"), timeout=60)[0]
        browser.get(ui_server + "/")
        row = _wait("the run in the list",
                    lambda: browser.find_element("css selector", f'tr[data-run="UiFlow/{run.run_id}"]'))
        assert row.get_attribute("data-status") == "running"
        shots(browser, "01-runs-list-running")

        browser.get(f"{ui_server}/runs/UiFlow/{run.run_id}")
        first = _wait("loss points", lambda: _points(browser) >= 2 and _points(browser), timeout=60)
        assert db.get_run("UiFlow", run.run_id).status == "running"
        shots(browser, "02-run-page-running")
        time.sleep(2.5)
        browser.refresh()  # a reload during the run shows the points that landed since
        later = _wait("more loss points after a reload", lambda: _points(browser) > first and _points(browser))
        assert later > first and db.get_run("UiFlow", run.run_id).status == "running", (first, later)
        assert browser.find_element("id", "log-state").text == "live"  # the running task's log, tailed
        _wait("new log lines", lambda: "step 10 loss" in browser.find_element("id", "log-text").text, timeout=30)

        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0, out
        # the open page notices the end by itself (polling): status, DAG and chart are final
        _wait("the run page to turn succeeded",
              lambda: browser.find_element("id", "run-status").get_attribute("data-status") == "succeeded")
        _wait("all points", lambda: _points(browser) == STEPS)
        states = {g.get_attribute("data-step"): g.get_attribute("data-state")
                  for g in browser.find_elements("css selector", "#dag g.step")}
        assert states == {"start": "ok", "train": "ok", "end": "ok"}
        assert browser.find_element("id", "chart-loss").find_element("css selector", "polyline").get_attribute(
            "data-points") == str(STEPS)
        mon = browser.find_elements("css selector", "#monitor-charts .chart")  # node 0: utilisation and memory
        assert len(mon) == 2 and all(int(c.get_attribute("data-points")) >= STEPS for c in mon)
        shots(browser, "03-run-page-succeeded")

        browser.get(ui_server + "/")
        status = browser.find_element("css selector", f'tr[data-run="UiFlow/{run.run_id}"] .status')
        assert status.text == "succeeded"
        assert status.value_of_css_property("background-color") in ("rgba(46, 158, 68, 1)", "rgb(46, 158, 68)")
        shots(browser, "04-runs-list-green")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    p = run_flow("ui_flow.py", "run", "--steps", "3", "--pause", "0.05", "--fail", "1", cwd=tmp_path, check=False)
    assert p.returncode != 0
    failed = db.list_runs("UiFlow", status="failed")[0]
    browser.get(f"{ui_server}/runs/UiFlow/{failed.run_id}")
    box = _wait("the failure box", lambda: browser.find_element("id", "failure").is_displayed()
                and browser.find_element("id", "failure"))
    assert "ui test failure: the loss exploded" in box.text and "train" in box.text
    log = _wait("the failing task's log", lambda: "ui test failure" in browser.find_element("id", "log-text").text
                and browser.find_element("id", "log-text"))
    assert "ValueError" in log.text
    assert browser.find_element("id", "log-state").text == "complete"
    browser.find_element("id", "log-filter").send_keys("ValueError")
    lines = [ln for ln in browser.find_element("id", "log-text").text.splitlines() if ln.strip()]
    assert lines and all("ValueError" in ln for ln in lines)
    states = {g.get_attribute("data-step"): g.get_attribute("data-state")
              for g in browser.find_elements("css selector", "#dag g.step")}
    assert states == {"start": "ok", "train": "failed", "end": "pending"}
    shots(browser, "05-failed-run-log")
    assert shutil.which("chromium") or os.path.exists(CHROMIUM)
