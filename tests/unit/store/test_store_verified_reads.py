"""Every artifact read is verified against its content address (issue 27): one byte flipped in a stored blob,
its size unchanged, makes the client's read raise StoreError, whatever the artifact's kind and wherever the store
is (a local folder, S3 on moto's and rclone's servers, an fsspec store), and nothing built from it is returned."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stoker._hashing import BLAKE3, SHA256, key_algo
from stoker.client import Task
from stoker.errors import StoreError
from stoker.store import artifacts as artifacts_module
from stoker.store import blobs as blobs_module
from stoker.store import load_artifact, open_store, save_artifact
from stoker.store.blobs import BlobStore, LocalBlobStore, blob_key_of
from stoker.store.objects import open_objects


def _torch():
    return pytest.importorskip("torch")


def _state_dict() -> Any:
    torch = _torch()
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).state_dict()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if type(a).__module__.startswith("torch"):
        return bool((a == b).all())
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


# kind -> (make the value, the index in the descriptor's blobs of the blob to damage, the descriptor's kind)
KINDS: dict[str, tuple[Callable[[], Any], int, str]] = {
    "bytes": (lambda: os.urandom(5000), 0, "bytes"),
    "pickle": (lambda: {"numbers": list(range(1000)), "text": "x" * 500}, 0, "pickle"),
    "pickle-buffer": (lambda: {"weights": np.arange(512, dtype=np.float64), "step": 7}, 1, "pickle"),
    "numpy-small": (lambda: np.arange(64, dtype=np.float64).reshape(8, 8), 0, "ndarray"),
    "numpy-mmap": (lambda: np.arange(600_000, dtype=np.float32), 0, "ndarray"),  # 2.4 MB: memory-mapped
    "tensor": (lambda: _torch().arange(300, dtype=_torch().float32).reshape(30, 10), 0, "tensor"),
    "state-dict": (_state_dict, 1, "pickle"),
}


def flip(data: bytes) -> bytes:
    """One byte in the middle changed, the size the same."""
    i = len(data) // 2
    return data[:i] + bytes([data[i] ^ 0x5A]) + data[i + 1:]


def flip_file(path: Path) -> None:
    os.chmod(path, 0o644)
    path.write_bytes(flip(path.read_bytes()))


def record(maker: Any, value: Any) -> dict[str, Any]:
    """A task F/1/start/1 with artifact x = value; its descriptor."""
    maker.run("F", "1")
    return maker.task("F", "1", "start", "1", data={"x": value})["artifacts"]["x"]


def damaged_key(desc: dict[str, Any], kind: str) -> str:
    _, index, expected = KINDS[kind]
    assert desc["kind"] == expected, desc
    key = desc["blobs"][index]
    assert key_algo(key) == BLAKE3  # new blobs are addressed by their BLAKE3 hash
    return key


def read_x(maker: Any) -> Any:
    """The client's read of F/1/start/1's artifact x (a fresh Task: nothing cached on the object)."""
    return Task("F/1/start/1", db=maker.db, store=maker.store).data.x


# --- a local folder ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_flipped_byte_in_a_local_blob_is_refused(kind, maker):
    value = KINDS[kind][0]()
    desc = record(maker, value)
    key = damaged_key(desc, kind)
    assert _same(read_x(maker), value)  # intact: it loads (and, memory-mapped, is now verified in this process)
    flip_file(maker.store.blob_path(key, verify=False))
    with pytest.raises(StoreError) as info:
        read_x(maker)
    msg = str(info.value)
    assert key in msg and "changed after it was written" in msg and "rerun the step" in msg.lower(), msg
    assert "\n" not in msg
    with pytest.raises(StoreError, match="was not loaded"):  # the message names the artifact and its task
        load_artifact(maker.store, desc, name="x", pathspec="F/1/start/1")
    with pytest.raises(StoreError, match=r"artifact 'x' of task F/1/start/1 .*resume 1 --step start"):
        load_artifact(maker.store, desc, name="x", pathspec="F/1/start/1")


@pytest.mark.parametrize("mmap", [True, False])
def test_both_reads_of_an_array_are_verified(mmap, store):
    arr = np.arange(300_000, dtype=np.float64)
    desc = save_artifact(store, arr)
    flip_file(store.blob_path(desc["blobs"][0], verify=False))
    with pytest.raises(StoreError, match="does not match its hash"):
        load_artifact(store, desc, mmap=mmap)


def test_a_memory_mapped_blob_is_hashed_once_per_process(store, monkeypatch):
    desc = save_artifact(store, np.arange(1 << 19, dtype=np.float32))  # 2 MiB: memory-mapped
    monkeypatch.setattr(blobs_module, "_VERIFIED", set())  # as in a new process (the writer's own file is known)
    calls = []
    real = blobs_module.hash_of
    monkeypatch.setattr(blobs_module, "hash_of", lambda key, data: calls.append(key) or real(key, data))
    for _ in range(3):
        assert float(load_artifact(store, desc)[-1]) == (1 << 19) - 1
    assert calls == [desc["blobs"][0]]
    flip_file(store.blob_path(desc["blobs"][0], verify=False))  # a write gives the file another identity
    with pytest.raises(StoreError, match="does not match its hash"):
        load_artifact(store, desc)
    assert len(calls) == 2


def test_blobs_are_read_only_on_local_disk(store):
    for kind, (make, _, _) in KINDS.items():
        if kind in ("tensor", "state-dict"):
            continue
        for key in save_artifact(store, make())["blobs"]:
            assert oct(store.blob_path(key).stat().st_mode & 0o777) == oct(0o444), kind


def test_rerunning_the_step_rewrites_a_damaged_blob(store, caplog):
    """The fix the error names works: storing the same value again replaces the damaged blob (a put used to see the
    right size and keep it)."""
    arr = np.arange(300_000, dtype=np.float64)
    desc = save_artifact(store, arr)
    flip_file(store.blob_path(desc["blobs"][0], verify=False))
    with caplog.at_level(logging.WARNING, logger="stoker.store.blobs"):
        assert save_artifact(store, arr)["blobs"] == desc["blobs"]
    assert "does not hash to its key" in caplog.text
    assert np.array_equal(load_artifact(store, desc), arr)


def test_sha256_keys_stay_readable_and_verified(store, monkeypatch):
    """Blobs stored before BLAKE3 (64 hex digits: sha256) load, and are verified with sha256."""
    monkeypatch.setattr(artifacts_module, "preferred_algo", lambda: SHA256)
    arr = np.arange(300_000, dtype=np.float64)
    old = {"arr": save_artifact(store, arr), "obj": save_artifact(store, {"w": np.ones(100), "n": 1})}
    assert all(key_algo(k) == SHA256 and len(k) == 64 for d in old.values() for k in d["blobs"])
    monkeypatch.undo()
    assert np.array_equal(load_artifact(store, old["arr"]), arr)
    assert load_artifact(store, old["obj"])["n"] == 1
    flip_file(store.blob_path(old["arr"]["blobs"][0], verify=False))
    with pytest.raises(StoreError, match="does not match its hash"):
        load_artifact(store, old["arr"])


def test_blob_path_verifies_the_file(store):
    key = store.put_blob(os.urandom(100_000), algo=BLAKE3)
    path = store.blob_path(key)
    assert path.name == key and path.parent.name == key[3:5]
    flip_file(path)
    with pytest.raises(StoreError, match="does not match its hash"):
        store.blob_path(key)
    with pytest.raises(StoreError, match="does not match its hash"):
        store.get_blob(key)
    assert store.verify_blob(key) is False


# --- remote stores: S3 (moto, rclone) and fsspec -------------------------------------------------------------------
def remote_read_is_refused(kind: str, maker: Any, rewrite: Callable[[str, bytes], None],
                           read_object: Callable[[str], bytes]) -> None:
    """Damage the object in the remote store and the copy this machine's cache holds (the writer keeps what it
    uploaded there), then read: the damaged copy is not trusted, the download is refused."""
    value = KINDS[kind][0]()
    desc = record(maker, value)
    key = damaged_key(desc, kind)
    assert _same(read_x(maker), value)
    rel = blob_key_of(key)
    rewrite(rel, flip(read_object(rel)))
    cached = maker.store.cache_dir / rel
    if cached.exists():
        flip_file(cached)
    with pytest.raises(StoreError) as info:
        read_x(maker)
    msg = str(info.value)
    assert key in msg and "changed after it was written" in msg and "\n" not in msg, msg


@pytest.fixture
def moto_bucket(aws):
    client = aws.client("s3")
    bucket = f"verified-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    return client, bucket


@pytest.mark.aws
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_flipped_byte_in_an_s3_blob_is_refused(kind, moto_bucket, maker, tmp_path):
    client, bucket = moto_bucket
    s3 = open_store(f"s3://{bucket}/p", client=client, cache_dir=tmp_path / "cache")
    remote = type(maker)(s3, maker.db)
    remote_read_is_refused(
        kind, remote, lambda rel, data: client.put_object(Bucket=bucket, Key=f"p/{rel}", Body=data),
        lambda rel: client.get_object(Bucket=bucket, Key=f"p/{rel}")["Body"].read())


@pytest.mark.aws
@pytest.mark.parametrize("kind", ["numpy-mmap", "pickle-buffer", "bytes"])
def test_rclone_refuses_flip(kind, rclone_s3, maker, tmp_path):
    """A flipped byte in an S3 blob on a second S3 server (rclone; the test's name is short: it names the bucket)."""
    import boto3

    client = boto3.session.Session(aws_access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
                                   aws_secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
                                   region_name="us-east-1").client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    s3 = open_store(f"s3://{rclone_s3}/p", cache_dir=tmp_path / "cache")  # (its client from $STOKER_S3_*)
    remote = type(maker)(s3, maker.db)
    remote_read_is_refused(
        kind, remote, lambda rel, data: client.put_object(Bucket=rclone_s3, Key=f"p/{rel}", Body=data),
        lambda rel: client.get_object(Bucket=rclone_s3, Key=f"p/{rel}")["Body"].read())


@pytest.mark.parametrize("kind", ["bytes", "pickle-buffer", "numpy-small", "numpy-mmap"])
def test_a_flipped_byte_in_an_fsspec_blob_is_refused(kind, maker, tmp_path):
    pytest.importorskip("fsspec")
    objects = open_objects(f"memory://verified-{uuid.uuid4().hex[:8]}")
    store = BlobStore(objects, cache_dir=tmp_path / "cache")
    remote = type(maker)(store, maker.db)
    remote_read_is_refused(kind, remote, lambda rel, data: objects.put_bytes(rel, data),
                           lambda rel: objects.get_bytes(rel))


@pytest.mark.aws
def test_a_damaged_cached_copy_is_downloaded_again(moto_bucket, tmp_path, caplog):
    """Only this machine's copy was damaged (the object in S3 is intact): the read is right, the copy replaced."""
    client, bucket = moto_bucket
    s3 = open_store(f"s3://{bucket}/p", client=client, cache_dir=tmp_path / "cache")
    arr = np.arange(600_000, dtype=np.float32)
    desc = save_artifact(s3, arr)
    cached = s3.cache_dir / blob_key_of(desc["blobs"][0])
    assert cached.exists()
    flip_file(cached)
    with caplog.at_level(logging.WARNING, logger="stoker.store.blobs"):
        assert np.array_equal(load_artifact(s3, desc), arr)
    assert "does not hash to its key" in caplog.text
    assert oct(cached.stat().st_mode & 0o777) == oct(0o444)
    fresh = open_store(f"s3://{bucket}/p", client=client, cache_dir=tmp_path / "other-cache")
    assert np.array_equal(load_artifact(fresh, desc), arr)


@pytest.mark.aws
def test_an_s3_blob_damaged_before_a_cold_read_is_refused(moto_bucket, tmp_path):
    client, bucket = moto_bucket
    writer = open_store(f"s3://{bucket}/p", client=client, cache_dir=tmp_path / "writer")
    desc = save_artifact(writer, np.arange(600_000, dtype=np.float32))
    obj = f"p/{blob_key_of(desc['blobs'][0])}"
    client.put_object(Bucket=bucket, Key=obj, Body=flip(client.get_object(Bucket=bucket, Key=obj)["Body"].read()))
    reader = open_store(f"s3://{bucket}/p", client=client, cache_dir=tmp_path / "reader")
    with pytest.raises(StoreError, match="does not match its hash"):
        load_artifact(reader, desc)
    assert not list((tmp_path / "reader" / "blobs").rglob("b3-*"))  # nothing damaged entered the cache


def test_local_blob_store_keys_name_their_hash(tmp_path):
    store = LocalBlobStore(tmp_path / "s")
    data = b"abc" * 1000
    assert key_algo(store.put_blob(data)) == SHA256  # the default of the blob API (the Neuron cache relies on it)
    b3 = store.put_blob(data, algo=BLAKE3)
    assert b3.startswith("b3-") and store.get_blob(b3) == data
    with pytest.raises(StoreError, match="not a blob key"):
        store.get_blob("b3-" + "0" * 63)


def test_without_the_blake3_package_new_blobs_are_sha256_and_b3_keys_say_what_to_install(store, monkeypatch):
    import sys

    from stoker._hashing import preferred_algo

    desc = save_artifact(store, np.arange(1000.0))
    monkeypatch.setitem(sys.modules, "blake3", None)  # `import blake3` raises ImportError
    assert preferred_algo() == SHA256
    assert key_algo(save_artifact(store, np.arange(2000.0))["blobs"][0]) == SHA256
    with pytest.raises(StoreError, match="pip install blake3"):
        load_artifact(store, desc, mmap=False)
