"""The local blob store: content addressing, dedup, atomic named objects, listing."""

from __future__ import annotations

import hashlib
import os
import threading

import numpy as np
import pytest

from stoker.errors import StoreError
from stoker.store import open_store
from stoker.store.blobs import LocalBlobStore
from stoker.store.paths import default_db_path, default_store_url, home_dir


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_put_bytes_is_content_addressed_and_deduplicated(store):
    key = store.put_bytes(b"hello")
    assert key == sha(b"hello")
    assert store.get_bytes(key) == b"hello"
    path = store.blob_path(key)
    assert path == store.root / "blobs" / key[:2] / key
    before = os.stat(path)
    assert store.put_bytes(memoryview(b"hello")) == key  # same content: not rewritten
    after = os.stat(path)
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)
    assert not os.access(path, os.W_OK) or os.geteuid() == 0  # blobs are read-only
    assert oct(after.st_mode & 0o777) == oct(0o444)
    assert store.has_blob(key) and not store.has_blob(sha(b"other"))


def test_put_stream_hashes_chunks_without_concatenating(store):
    chunks = [os.urandom(1000), memoryview(os.urandom(5000)), b"", os.urandom(3)]
    whole = b"".join(bytes(c) for c in chunks)
    key = store.put_stream(iter(chunks))
    assert key == sha(whole)
    assert store.get_bytes(key) == whole
    assert store.put_stream([]) == sha(b"")
    assert store.get_bytes(sha(b"")) == b""


def test_put_stream_of_many_large_chunks_uses_pipelined_hash(store):
    arr = np.arange(3 << 20, dtype=np.uint8)
    chunks = [memoryview(arr)[i: i + (1 << 20)] for i in range(0, arr.size, 1 << 20)]
    assert store.put_stream(chunks) == sha(arr.tobytes())


def test_failed_stream_leaves_no_blob_and_no_temp_file(store):
    def chunks():
        yield b"partial"
        raise RuntimeError("producer died")

    with pytest.raises(RuntimeError, match="producer died"):
        store.put_stream(chunks())
    assert os.listdir(store.root / ".tmp") == []
    assert not store.has_blob(sha(b"partial")) and list((store.root / "blobs").rglob("*")) == []


def test_put_file_copy_and_move(store, tmp_path):
    src = tmp_path / "f.bin"
    src.write_bytes(b"x" * 100_000)
    key = store.put_file(src)
    assert src.exists() and key == sha(b"x" * 100_000)
    moved = tmp_path / "g.bin"
    moved.write_bytes(b"moved content")
    key2 = store.put_file(moved, move=True)
    assert not moved.exists() and store.get_bytes(key2) == b"moved content"
    dup = tmp_path / "h.bin"
    dup.write_bytes(b"moved content")
    assert store.put_file(dup, move=True) == key2 and not dup.exists()  # deduplicated: source consumed
    with pytest.raises(StoreError, match="not a file"):
        store.put_file(tmp_path / "missing")


def test_missing_and_malformed_keys(store):
    with pytest.raises(StoreError, match="missing from the store"):
        store.get_bytes(sha(b"never stored"))
    with pytest.raises(StoreError, match="not a blob key"):
        store.blob_path("../../etc/passwd")


def test_blob_path_can_be_memory_mapped_and_verified(store):
    arr = np.arange(1000, dtype=np.float32)
    key = store.put_bytes(arr.tobytes())
    mapped = np.memmap(store.blob_path(key), dtype=np.float32, mode="r")
    assert np.array_equal(mapped, arr)
    assert store.verify_blob(key)


def test_named_objects_roundtrip_list_delete(store):
    store.write("runs/F/1/start/1/0/manifest.json", b"{}")
    store.write("runs/F/1/end/2/0/manifest.json", b"{1}")
    store.write("runs/F/10/start/1/0/manifest.json", b"{2}")
    store.write("runs/G/1/x.log", b"log")
    store.put_bytes(b"a blob is never listed")
    assert store.read("runs/F/1/end/2/0/manifest.json") == b"{1}"
    assert store.exists("runs/G/1/x.log") and not store.exists("runs/G/1/y.log")
    assert store.list("runs/F/1/") == ["runs/F/1/end/2/0/manifest.json", "runs/F/1/start/1/0/manifest.json"]
    assert store.list("runs/F/1") == ["runs/F/1/end/2/0/manifest.json", "runs/F/1/start/1/0/manifest.json",
                                      "runs/F/10/start/1/0/manifest.json"]
    assert len(store.list()) == 4 and store.list("nothing/") == []
    store.write("runs/G/1/x.log", b"replaced", durable=False)
    assert store.read("runs/G/1/x.log") == b"replaced"
    store.delete("runs/G/1/x.log")
    store.delete("runs/G/1/x.log")  # deleting twice is fine
    assert not store.exists("runs/G/1/x.log")
    with pytest.raises(StoreError, match="'runs/G/1/x.log' does not exist"):
        store.read("runs/G/1/x.log")
    assert store.local_path("a/b") == store.root / "a" / "b"
    assert os.listdir(store.root / ".tmp") == []


@pytest.mark.parametrize("name", ["", "/abs", "a/../b", "blobs/x", ".tmp/x", "a//b", "a\\b"])
def test_invalid_object_names(store, name):
    with pytest.raises(StoreError, match="object name"):
        store.write(name, b"x")


def test_named_object_replacement_is_atomic_under_concurrent_readers(store):
    """Readers never see a torn object while a writer replaces it."""
    payloads = [bytes([i]) * 200_000 for i in range(2)]
    store.write("ptr", payloads[0])
    stop = threading.Event()
    seen, torn = set(), []

    def reader():
        while not stop.is_set():
            data = store.read("ptr")
            seen.add(data[:1])
            if data not in payloads:
                torn.append(len(data))

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for i in range(100):
        store.write("ptr", payloads[i % 2], durable=i % 2 == 0)
    stop.set()
    for t in threads:
        t.join()
    assert torn == [] and len(seen) >= 1
    assert os.listdir(store.root / ".tmp") == []


def test_concurrent_puts_of_the_same_content(store):
    data = os.urandom(1 << 20)
    keys = []
    threads = [threading.Thread(target=lambda: keys.append(store.put_stream([data[:1000], data[1000:]])))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(keys) == {sha(data)} and store.get_bytes(sha(data)) == data


def test_default_locations_follow_environment(monkeypatch, tmp_path, _stoker_home):
    assert home_dir() == _stoker_home.resolve()
    assert default_store_url() == str(_stoker_home.resolve() / "store")
    assert default_db_path() == _stoker_home.resolve() / "metadata.db"
    s = open_store()
    assert isinstance(s, LocalBlobStore) and s.root == _stoker_home.resolve() / "store"
    monkeypatch.setenv("STOKER_STORE", str(tmp_path / "elsewhere"))
    assert open_store().root == tmp_path / "elsewhere"
    assert open_store(f"file://{tmp_path}/x").root == tmp_path / "x"
    monkeypatch.delenv("STOKER_HOME")
    monkeypatch.chdir(tmp_path)
    assert home_dir() == tmp_path / ".stoker"
    with pytest.raises(StoreError, match="unsupported store URL"):
        open_store("gs://bucket/x")
