"""Signed manifests and run records, the pickle trust policy, and the store's key (issue 13, Security).

Attacks are simulated by editing the store's files directly (a forged manifest, a replaced blob), as anyone
with write access to a shared store could."""

from __future__ import annotations

import base64
import json
import os
import pickle
import stat

import numpy as np
import pytest

from stoker.client import Task
from stoker.errors import StoreError
from stoker.store import load_artifact
from stoker.store.blobs import LocalBlobStore
from stoker.store.manifest import (
    manifest_name,
    read_manifest,
    read_run_record,
    run_record_name,
    write_run_record,
)
from stoker.store.signing import key_path


class _Evil:
    """Unpickling this runs code: it creates the file named in its argument."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _forge(store: LocalBlobStore, name: str, change) -> None:
    path = store.root / name
    doc = json.loads(path.read_text())
    change(doc)
    os.chmod(path, 0o644)
    path.write_text(json.dumps(doc))


def test_a_forged_manifest_is_refused_before_anything_is_unpickled(maker, store, db, tmp_path):
    maker.run("F", "1")
    maker.task("F", "1", "start", "1", data={"x": {"a": 1}})
    assert read_manifest(store, "F", "1", "start", "1", 0)["signature"].startswith("hmac-sha256:")
    owned = tmp_path / "owned"
    evil = base64.b64encode(pickle.dumps(_Evil(str(owned)))).decode()
    _forge(store, manifest_name("F", "1", "start", "1", 0),
           lambda m: m["artifacts"]["x"].update(inline=evil, sha="0" * 64))
    with pytest.raises(StoreError, match=r"manifest.json .* bad signature.*STOKER_STORE_KEY"):
        read_manifest(store, "F", "1", "start", "1", 0)
    with pytest.raises(StoreError, match="bad signature"):  # the client reads the signed manifest, not the index
        _ = Task("F/1/start/1", db=db, store=store).data.x
    assert not owned.exists()


def test_an_unsigned_manifest_is_refused_unless_trusted(maker, store, monkeypatch):
    maker.run("F", "1")
    maker.task("F", "1", "start", "1", data={"x": 5})
    _forge(store, manifest_name("F", "1", "start", "1", 0), lambda m: m.pop("signature"))
    with pytest.raises(StoreError, match="is not signed.*STOKER_TRUST_UNSIGNED=1"):
        read_manifest(store, "F", "1", "start", "1", 0)
    monkeypatch.setenv("STOKER_TRUST_UNSIGNED", "1")
    m = read_manifest(store, "F", "1", "start", "1", 0)
    assert load_artifact(store, m["artifacts"]["x"]) == 5


def test_run_records_are_signed(store):
    write_run_record(store, {"flow": "F", "run_id": "1", "user": "alice", "params": {"n": 1}})
    assert read_run_record(store, "F", "1")["params"] == {"n": 1}
    _forge(store, run_record_name("F", "1"), lambda r: r["params"].update(n=2))
    with pytest.raises(StoreError, match="run.json .* bad signature"):
        read_run_record(store, "F", "1")


def test_a_replaced_pickle_blob_is_not_unpickled(maker, store, tmp_path):
    """A large pickle body lives in a blob; whoever can write the store could replace the blob's file."""
    maker.run("F", "1")
    maker.task("F", "1", "start", "1", data={"big": [str(i) * 50 for i in range(100)]})
    desc = read_manifest(store, "F", "1", "start", "1", 0)["artifacts"]["big"]
    assert "inline" not in desc
    owned = tmp_path / "owned"
    blob = store.blob_path(desc["blobs"][0])
    os.chmod(blob, 0o644)
    blob.write_bytes(pickle.dumps(_Evil(str(owned))))
    with pytest.raises(StoreError, match="does not match its hash"):
        load_artifact(store, desc)
    assert not owned.exists()


def test_the_key_lives_outside_the_store_and_is_private(store, tmp_path, monkeypatch):
    monkeypatch.delenv("STOKER_STORE_KEY")
    monkeypatch.setenv("STOKER_KEY_DIR", str(tmp_path / "keys"))
    from stoker.store.signing import store_key

    # only the machine that starts runs makes a key: a node or a teammate without one is told, never given its own
    with pytest.raises(StoreError, match="no signing key for the store .*copy the key file"):
        write_run_record(store, {"flow": "F", "run_id": "1", "user": "alice", "params": {}})
    store_key(store.url, create=True)  # what start_run does
    write_run_record(store, {"flow": "F", "run_id": "1", "user": "alice", "params": {}})
    key = key_path(store.url)
    assert key.parent == tmp_path / "keys" and not str(key).startswith(str(store.root))
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert read_run_record(store, "F", "1")["user"] == "alice"
    monkeypatch.setenv("STOKER_STORE_KEY", "another key")  # a node with the wrong key cannot read the run
    with pytest.raises(StoreError, match="bad signature"):
        read_run_record(store, "F", "1")


def test_a_remote_store_without_a_key_names_the_fix(monkeypatch, tmp_path):
    from stoker.store.signing import store_key

    monkeypatch.delenv("STOKER_STORE_KEY")
    monkeypatch.setenv("STOKER_KEY_DIR", str(tmp_path / "keys"))
    with pytest.raises(StoreError, match="no signing key for the store s3://b/p: set STOKER_STORE_KEY"):
        store_key("s3://b/p")
    assert len(store_key("s3://b/p", create=True)) == 64  # start_run makes it on the launching machine


def test_trust_self_refuses_other_users_pickles_but_loads_arrays(maker, store, db, monkeypatch):
    maker.run("F", "1", user="mallory")
    maker.task("F", "1", "start", "1", user="mallory", data={"obj": {"a": 1}, "arr": np.arange(4)})
    monkeypatch.setenv("STOKER_USER", "alice")
    kw = {"db": db, "store": store, "_namespace_check": False}
    assert Task("F/1/start/1", **kw).data.obj == {"a": 1}  # default: trust the store's writers
    monkeypatch.setenv("STOKER_TRUST", "self")
    task = Task("F/1/start/1", **kw)
    assert list(task.data.arr) == [0, 1, 2, 3]  # raw arrays are not unpickled
    with pytest.raises(StoreError, match=r"run F/1 was written by user 'mallory'.*"
                                         r"STOKER_TRUST_USERS=alice,mallory or STOKER_TRUST=all"):
        _ = task.data.obj
    monkeypatch.setenv("STOKER_TRUST_USERS", "mallory")
    assert Task("F/1/start/1", **kw).data.obj == {"a": 1}


def test_a_bad_trust_setting_names_the_choices(monkeypatch):
    from stoker.errors import ConfigError
    from stoker.store.signing import trusted_users

    monkeypatch.setenv("STOKER_TRUST", "nobody")
    with pytest.raises(ConfigError, match="use 'all'.*or 'self'"):
        trusted_users()
