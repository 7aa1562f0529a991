"""Issue 27: a damaged index says so and how to repair it (`stoker reindex`), the writable-folder hint only where
access was refused; user tags cannot take a system tag's prefix or hold a control character."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from stoker.client import Run
from stoker.errors import ConfigError, StoreError
from stoker.store.blobs import open_store
from stoker.store.metadata import MetadataDB, index_fix
from stoker.store.tags import SYSTEM_TAG_PREFIXES, check_user_tags
from tests.helpers import EXAMPLES


def _sqlite_error(message: str, code: int | None) -> sqlite3.Error:
    e = sqlite3.DatabaseError(message)
    if code is not None:
        e.sqlite_errorcode = code
    return e


@pytest.mark.parametrize("error, fix", [
    (_sqlite_error("file is not a database", sqlite3.SQLITE_NOTADB), "damaged (corrupt)"),
    (_sqlite_error("database disk image is malformed", sqlite3.SQLITE_CORRUPT), "stoker reindex"),
    (_sqlite_error("database or disk is full", sqlite3.SQLITE_FULL), "free space"),
    (OSError(28, "No space left on device"), "free space"),
    (_sqlite_error("attempt to write a readonly database", sqlite3.SQLITE_READONLY), "writable folder"),
    (PermissionError(13, "Permission denied"), "writable folder"),
    (_sqlite_error("unable to open database file", sqlite3.SQLITE_CANTOPEN), "writable folder"),
    (_sqlite_error("disk I/O error", sqlite3.SQLITE_IOERR), "check the file system"),
])
def test_each_failure_of_the_index_gets_its_own_fix(error, fix, tmp_path):
    said = index_fix(tmp_path / "metadata.db", error)
    assert fix in said
    assert ("writable" in said) == (fix == "writable folder")  # the writable-folder hint only for refused access


def test_a_corrupt_index_is_named_and_reindex_rebuilds_it_from_the_store(tmp_path):
    env = {**os.environ, "STOKER_HOME": str(tmp_path / "home"), "USER": "tester"}
    env.pop("STOKER_DEBUG", None)

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *argv], env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=120)

    assert run(str(EXAMPLES / "hello.py"), "run", "--quiet").returncode == 0
    db = tmp_path / "home" / "metadata.db"
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    db.write_bytes(b"not a database any more\n" * 200)
    broken = run("-m", "stoker.cli.main", "runs")
    assert broken.returncode == 1 and "Traceback" not in broken.stderr
    assert "damaged (corrupt)" in broken.stderr and "stoker reindex" in broken.stderr
    assert "writable" not in broken.stderr
    fixed = run("-m", "stoker.cli.main", "reindex")
    assert fixed.returncode == 0 and "reindexed 1 run(s)" in fixed.stdout, fixed.stderr
    assert list(db.parent.glob("metadata.db.damaged-*"))  # the damaged file is kept
    listed = run("-m", "stoker.cli.main", "runs")
    assert listed.returncode == 0 and "HelloFlow" in listed.stdout and "succeeded" in listed.stdout


def test_reserved_prefixes_are_the_system_tags_stoker_sets():
    from stoker.flow.project import BRANCH_TAG, PROJECT_TAG

    assert set(SYSTEM_TAG_PREFIXES) == {"user:", PROJECT_TAG, BRANCH_TAG}


@pytest.mark.parametrize("tag, message", [
    ("user:mallory", "'user:' are system tags"),
    ("project:other", "'project:' are system tags"),
    ("project_branch:prod", "'project_branch:' are system tags"),
    ("two\nlines", "control character ('\\n')"),
    ("esc\x1b[31m", "control character ('\\x1b')"),
    ("sep\u2028", "control character"),
])
def test_a_user_tag_is_refused(tag, message):
    with pytest.raises(ConfigError) as e:
        check_user_tags([tag], user="alice")
    assert message in str(e.value)


def test_the_runs_own_system_tags_pass():
    assert check_user_tags(["user:alice", "exp:a", "userx"], user="alice") == ["user:alice", "exp:a", "userx"]
    assert check_user_tags(["project:p"], system=["project:p"]) == ["project:p"]


def test_run_add_tag_refuses_another_users_namespace(tmp_path):
    db = MetadataDB(tmp_path / "metadata.db")
    db.create_run("F", "1", user="alice", params={})
    run = Run("F/1", db=db, store=open_store(str(tmp_path / "store")), _namespace_check=False)
    run.add_tag("user:alice")  # its own system tag: nothing changes, no error (Metaflow's rule)
    for tag in ("user:mallory", "project:x", "a\tb"):
        with pytest.raises(ConfigError):
            run.add_tag(tag)
        with pytest.raises(ConfigError):
            run.replace_tag("nothing", tag)
    assert run.user_tags == frozenset() and "user:alice" in run.system_tags
    with pytest.raises(StoreError, match="system tag"):
        run.remove_tag("user:alice")
    db.close()
