"""The SQLite index under write faults: a failed COMMIT (lock held too long, disk full) is rolled back and
reported as a StoreError that names the database and the fix, and the next write works."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import uuid

import pytest

from stoker.errors import StoreError
from stoker.store import MetadataDB
from stoker.store import metadata as metadata_mod


def _run_ids(path) -> list[str]:
    """The run ids in the database at ``path``, read by a fresh connection (what another process sees)."""
    conn = sqlite3.connect(path)
    try:
        return [r[0] for r in conn.execute("SELECT run_id FROM runs ORDER BY run_id")]
    finally:
        conn.close()


def test_commit_blocked_by_a_reader_is_rolled_back(tmp_path, monkeypatch):
    """A real lock conflict, no fault injection: with a rollback journal, COMMIT needs an exclusive lock that
    a reader's open transaction denies; SQLite then fails COMMIT with SQLITE_BUSY and leaves the
    transaction open. It must be rolled back and reported, and the next write must work."""
    monkeypatch.setenv("STOKER_SQLITE_JOURNAL", "delete")
    monkeypatch.setattr(metadata_mod, "_BUSY_TIMEOUT_S", 0.2)
    path = tmp_path / "metadata.db"
    db = MetadataDB(path)
    assert db.journal_mode == "delete"
    db.create_run("F", "1", user="u", params={})
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("BEGIN")
    assert reader.execute("SELECT count(*) FROM runs").fetchone() == (1,)  # holds a SHARED lock
    with pytest.raises(StoreError) as info:
        db.create_run("F", "2", user="u", params={}, tags=["exp:x"])
    msg = str(info.value)
    assert str(path) in msg and "another process holds it locked" in msg
    assert isinstance(info.value.__cause__, sqlite3.OperationalError)
    reader.execute("COMMIT")
    reader.close()
    # rolled back: run 2 (and its flow row, tags) is absent, and the connection takes new writes
    assert _run_ids(path) == ["1"] and db.get_run("F", "2") is None
    db.create_run("F", "2", user="u", params={})
    db.set_run_status("F", "2", "succeeded", finished_at=1.0)
    assert _run_ids(path) == ["1", "2"]
    db.close()


class _CommitFails:
    """A connection wrapper whose next COMMIT raises ``error`` (an injected fault, as SQLite raises it when
    the disk fills while the commit is written); everything else goes to the real connection."""

    def __init__(self, conn: sqlite3.Connection, error: sqlite3.Error) -> None:
        self._conn, self._error = conn, error

    def execute(self, sql: str, *args):
        if sql.strip().upper() == "COMMIT" and self._error is not None:
            error, self._error = self._error, None
            raise error
        return self._conn.execute(sql, *args)

    def __getattr__(self, name: str):
        return getattr(self._conn, name)


def test_commit_failing_with_disk_full_is_rolled_back(db):
    """Injected fault: COMMIT raises SQLite's 'database or disk is full'."""
    db.create_run("F", "1", user="u", params={})
    real = db._conn
    db._conn = _CommitFails(real, sqlite3.OperationalError("database or disk is full"))
    with pytest.raises(StoreError) as info:
        db.create_run("F", "2", user="u", params={"big": "x" * 1000}, tags=["exp:y"])
    msg = str(info.value)
    assert str(db.path) in msg and "database or disk is full" in msg and "free space" in msg
    assert not real.in_transaction
    assert db.get_run("F", "2") is None and _run_ids(db.path) == ["1"]
    assert db.list_runs("F", tags=["exp:y"]) == []
    db.create_run("F", "2", user="u", params={})  # the next write works
    assert _run_ids(db.path) == ["1", "2"]


def test_database_filling_up_inside_a_write_is_rolled_back(db):
    """A real SQLITE_FULL, no injection: the database's page limit (PRAGMA max_page_count) is reached
    by a write; the error names the fix and the rows of the failed write are absent."""
    db.create_run("F", "1", user="u", params={})
    pages = db._conn.execute("PRAGMA page_count").fetchone()[0]
    db._conn.execute(f"PRAGMA max_page_count = {pages + 2}")
    with pytest.raises(StoreError, match="free space") as info:
        db.create_run("F", "2", user="u", params={"big": os.urandom(1 << 16).hex()})
    assert str(db.path) in str(info.value)
    db._conn.execute("PRAGMA max_page_count = 1073741823")
    assert db.get_run("F", "2") is None
    db.create_run("F", "2", user="u", params={})
    assert _run_ids(db.path) == ["1", "2"]


@pytest.fixture
def tiny_fs(tmp_path):
    """A 1 MiB tmpfs (needs root and mount permission; skipped otherwise)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", f"stoker-test-{uuid.uuid4().hex[:8]}",
                           str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_real_full_disk_at_commit_is_rolled_back(tiny_fs):
    """A real full file system (a 1 MiB tmpfs filled up): writing the commit fails with ENOSPC."""
    path = tiny_fs / "metadata.db"
    db = MetadataDB(path)
    db.create_run("F", "1", user="u", params={})
    filler = tiny_fs / "filler"
    with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)
    with pytest.raises(StoreError) as info:
        db.create_run("F", "2", user="u", params={"big": "y" * 200_000})
    assert str(path) in str(info.value) and "free space" in str(info.value)
    filler.unlink()
    assert db.get_run("F", "2") is None
    db.create_run("F", "3", user="u", params={})
    assert _run_ids(path) == ["1", "3"]
    db.close()
