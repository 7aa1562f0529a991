"""Issue 27: a disk that fills up at the end of a run, on a real full file system (a tmpfs, mounted as root).

The flow's last step fills the file system but for a little room for its own manifest; the driver's rewrite of the
run's large record (run.json) then fails with ENOSPC. The run process exits 1 with one message (no traceback) that
says how the run ended, what could not be written and how to continue it; `stoker runs`, `stoker show`, the client
and the UI show the run as `lost` (not `running`) with the command that continues it, from the driver's end marker
or, without it, because the driver's process is gone; once there is room, resume finishes it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest

from stoker.client import Flow
from stoker.store.blobs import open_store
from stoker.store.metadata import MetadataDB
from stoker.store.runstate import LOST, driver_alive, end_marker_name, run_state
from stoker.ui import data
from tests.helpers import run_flow

FLOW = "disk_full_flow.py"


@pytest.fixture
def tiny_fs(tmp_path):
    """A 4 MiB tmpfs (needs root and permission to mount; skipped otherwise)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root (CI runs the tests as root)")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", f"stoker-test-{uuid.uuid4().hex[:8]}", str(mnt)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _stoker(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stoker.cli.main", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "400", **env})


def test_a_full_disk_at_the_end_is_one_message_and_the_run_shows_lost(tiny_fs, tmp_path, monkeypatch):
    home = tiny_fs / "home"
    env = {"STOKER_HOME": str(home), "DISK_FULL_FILLER": str(tiny_fs / "filler")}
    monkeypatch.setenv("STOKER_HOME", str(home))
    p = run_flow(FLOW, "run", cwd=tmp_path, env=env, check=False)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "Traceback" not in p.stderr and "OSError" not in p.stderr, p.stderr
    error = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1, p.stderr
    assert "succeeded, but its end could not be recorded" in error[0] and "No space left on device" in error[0]
    run_id = next(iter(os.listdir(home / "store" / "runs" / "DiskFullFlow")))
    assert f"resume {run_id}" in error[0] and "show it as lost" in error[0]
    store = open_store(str(home / "store"))
    assert store.exists(end_marker_name("DiskFullFlow", run_id, "succeeded"))  # an empty file fits a full disk

    for marker in (True, False):  # the driver's end marker; without it, its pid is gone
        if not marker:
            store.delete(end_marker_name("DiskFullFlow", run_id, "succeeded"))
        runs = _stoker("runs", env=env)
        assert runs.returncode == 0, runs.stderr
        row = next(line for line in runs.stdout.splitlines() if line.startswith("DiskFullFlow"))
        assert row.split()[2] == LOST, runs.stdout
        assert f"lost: run DiskFullFlow/{run_id}" in runs.stdout and f"resume {run_id}" in runs.stdout
        assert ("ended (succeeded)" if marker else "is gone") in runs.stdout
        shown = json.loads(_stoker("show", f"DiskFullFlow/{run_id}", "--json", env=env).stdout)
        assert shown["status"] == LOST and f"resume {run_id}" in shown["note"]
        run = Flow("DiskFullFlow").latest_run
        assert run.status == LOST and run.finished and not run.successful and f"resume {run_id}" in run.lost_reason
        db = MetadataDB(home / "metadata.db")
        listed = data.list_runs(db, store)["runs"]
        assert [(r["status"], bool(r["note"])) for r in listed] == [(LOST, True)]
        assert data.list_runs(db, store, status=LOST)["runs"]
        assert not data.list_runs(db, store, status="running")["runs"]
        assert data.run_detail(db, store, "DiskFullFlow", run_id)["run"]["status"] == LOST
        db.close()

    (tiny_fs / "filler").unlink()  # room again: resume reuses both steps and ends the new run
    p = run_flow(FLOW, "resume", run_id, cwd=tmp_path, env={**env, "DISK_FULL_FILLER": str(tmp_path / "f")})
    assert "succeeded" in p.stdout
    runs = _stoker("runs", env=env).stdout
    assert f"(resumed by run {Flow('DiskFullFlow').latest_run.id})" in runs


def test_a_full_store_with_a_working_index_says_so(tiny_fs, tmp_path, monkeypatch):
    """Only the store is full (STOKER_STORE on the tmpfs): the index records the end, `stoker runs` shows it."""
    home = tmp_path / "home"
    env = {"STOKER_HOME": str(home), "STOKER_STORE": str(tiny_fs / "store"), "DISK_FULL_FILLER": str(tiny_fs / "f")}
    p = run_flow(FLOW, "run", cwd=tmp_path, env=env, check=False)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert "The index has its end, so `stoker runs` shows it as succeeded" in p.stderr, p.stderr
    runs = _stoker("runs", env=env)
    assert runs.stdout.splitlines()[1].split()[2] == "succeeded", runs.stdout


def test_driver_alive_tells_a_live_driver_a_gone_one_and_a_reused_pid():
    import socket
    import time

    import psutil

    me, host = os.getpid(), socket.gethostname()
    assert driver_alive(me, host, time.time()) is True
    assert driver_alive(me, host, psutil.Process().create_time() - 60) is False  # the pid of a younger process
    assert driver_alive(me, "another-host", time.time()) is None and driver_alive(None, host, time.time()) is None
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert driver_alive(child.pid, host, time.time()) is False


def test_run_state_keeps_the_index_word_when_the_store_cannot_tell(tmp_path):
    store = open_store(str(tmp_path / "store"))
    assert run_state(store, "F", "1", "running").status == "running"  # no record yet: starting
    assert run_state(None, "F", "1", "running").status == "running"
    assert run_state(store, "F", "1", "failed").status == "failed"
    store.write("runs/F/2/run.json", b"{not json")
    assert run_state(store, "F", "2", "running").status == "running"  # unreadable record: the index's word


def test_a_task_that_cannot_write_its_manifest_says_so_in_one_line(tiny_fs, tmp_path):
    """The end step leaves no room at all: its manifest cannot be stored. The task's log has one line naming it and
    the fix (issue 34 item 19), not stoker's own traceback."""
    env = {"STOKER_HOME": str(tiny_fs / "home"), "DISK_FULL_FILLER": str(tiny_fs / "filler"), "DISK_FULL_KEEP": "0"}
    p = run_flow(FLOW, "run", cwd=tmp_path, env=env, check=False)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert "its record (the manifest) could not be written to the store" in out, out
    assert "No space left on device" in out and "free space" in out and "`resume` the run" in out, out
    assert "Traceback" not in out, out
