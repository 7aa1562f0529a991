"""The local blob store's durability: blobs are fsynced (file, then folder) before a put returns, and a
put of content whose blob is torn (a truncated file at its content address) rewrites it."""

from __future__ import annotations

import errno
import hashlib
import os

import pytest

from stoker.errors import StoreError
from stoker.store.blobs import LocalBlobStore


def _tear(path) -> None:
    """Truncate a (read-only) blob file to half its size, as a power cut before its data hit the disk can."""
    size = path.stat().st_size
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    os.chmod(path, 0o444)


@pytest.mark.parametrize("how", ["bytes", "stream", "file", "move"])
def test_torn_blob_is_repaired_by_the_next_put(store, tmp_path, how, caplog):
    data = os.urandom(100_000)
    src = tmp_path / "src.bin"

    def put() -> str:
        if how == "bytes":
            return store.put_bytes(data)
        if how == "stream":
            return store.put_stream([data[:30_000], data[30_000:]])
        src.write_bytes(data)
        return store.put_file(src, move=how == "move")

    key = put()
    path = store.blob_path(key)
    _tear(path)
    assert not store.verify_blob(key)
    assert put() == key
    assert path.read_bytes() == data and store.verify_blob(key)
    assert oct(path.stat().st_mode & 0o777) == oct(0o444)
    assert "torn" in caplog.text and key in caplog.text
    assert os.listdir(store.root / ".tmp") == []
    if how == "move":
        assert not src.exists()


def test_an_intact_blob_is_not_rewritten(store):
    key = store.put_bytes(b"intact")
    before = os.stat(store.blob_path(key))
    store.put_bytes(b"intact")
    after = os.stat(store.blob_path(key))
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)


@pytest.mark.parametrize("how", ["bytes", "stream", "move"])
def test_blob_is_fsynced_before_it_is_named(store, tmp_path, monkeypatch, how):
    """Injected fault: fsync fails with EIO (a dying disk). The put must fail with a StoreError and leave
    nothing at the content address, which shows the blob's data is synced before it gets its name."""
    data = b"must reach the disk" * 1000
    key = hashlib.sha256(data).hexdigest()

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(StoreError, match=r"cannot write a blob to the store .*Input/output error"):
        if how == "bytes":
            store.put_bytes(data)
        elif how == "stream":
            store.put_stream([data])
        else:
            src = tmp_path / "src.bin"
            src.write_bytes(data)
            store.put_file(src, move=True)
    monkeypatch.undo()
    assert not store.has_blob(key)
    assert os.listdir(store.root / ".tmp") == []


def test_blob_file_and_folder_are_fsynced(store, monkeypatch):
    """Records what each fsync call synced (a wrapper around os.fsync that still syncs): the blob's
    content and, after the rename, its folder and (new folder) the blobs folder."""
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    if not os.path.exists("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd")
    monkeypatch.setattr(os, "fsync", recording_fsync)
    key = store.put_bytes(b"durable")
    folder = str(store.root / "blobs" / key[:2])
    assert len(synced) == 3 and synced[0].startswith(str(store.root / ".tmp" / "put-"))
    assert synced[1:] == [folder, str(store.root / "blobs")]
    synced.clear()
    store.put_bytes(b"durable")  # deduplicated: nothing to sync
    assert synced == []


def test_fsync_can_be_turned_off_for_scratch_stores(tmp_path, monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(os, "fsync", calls.append)
    scratch = LocalBlobStore(tmp_path / "scratch", fsync_blobs=False)
    scratch.put_bytes(b"scratch")
    scratch.put_stream([b"scratch", b"2"])
    assert calls == []


def test_full_disk_is_a_store_error_that_names_the_fix(store, monkeypatch):
    """Injected fault: fsync reports ENOSPC (delayed allocation finds the disk full at sync time)."""
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(StoreError, match="No space left on device; free space"):
        store.put_bytes(b"x" * 10)
