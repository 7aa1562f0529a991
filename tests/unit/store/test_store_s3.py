"""The S3 blob store against moto's S3 server on loopback (a real HTTP S3 API, no patching)."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from stoker.errors import StoreError
from stoker.store import load_artifact, open_store, save_artifact
from stoker.store.blobs import S3BlobStore
from stoker.store.manifest import read_manifest, write_manifest

pytestmark = pytest.mark.aws

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")


@pytest.fixture(scope="module")
def endpoint():
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def client(endpoint, monkeypatch):
    for var, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(var, value)
    c = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    c.create_bucket(Bucket="stoker-test")
    return c


@pytest.fixture
def s3(client, tmp_path):
    return open_store("s3://stoker-test/team/proj", client=client, cache_dir=tmp_path / "cache")


def test_blobs_on_s3(s3, client):
    assert isinstance(s3, S3BlobStore) and s3.url == "s3://stoker-test/team/proj"
    key = s3.put_bytes(b"hello")
    assert key == hashlib.sha256(b"hello").hexdigest()
    head = client.head_object(Bucket="stoker-test", Key=f"team/proj/blobs/{key[:2]}/{key}")
    assert head["ContentLength"] == 5
    assert s3.put_bytes(b"hello") == key and s3.has_blob(key)
    assert s3.get_bytes(key) == b"hello"
    big = os.urandom(3 << 20)
    k2 = s3.put_stream([big[: 1 << 20], memoryview(big)[1 << 20:]])
    assert k2 == hashlib.sha256(big).hexdigest()
    path = s3.blob_path(k2)
    assert path.read_bytes() == big
    missing = hashlib.sha256(b"nope").hexdigest()
    assert not s3.has_blob(missing)
    with pytest.raises(StoreError, match="missing from the store"):
        s3.get_bytes(missing)
    with pytest.raises(StoreError, match="missing from the store"):
        s3.blob_path(missing)


def test_blob_path_downloads_into_cache(s3, client, tmp_path):
    data = os.urandom(100_000)
    key = s3.put_bytes(data)  # put_bytes does not populate the cache
    fresh = S3BlobStore("stoker-test", "team/proj", client=client, cache_dir=tmp_path / "other-cache")
    path = fresh.blob_path(key)
    assert path.is_relative_to(tmp_path / "other-cache") and path.read_bytes() == data


def test_put_file_on_s3(s3, tmp_path):
    f = tmp_path / "f.bin"
    f.write_bytes(b"file content")
    key = s3.put_file(f, move=True)
    assert not f.exists() and s3.get_bytes(key) == b"file content"


def test_named_objects_on_s3(s3, client):
    s3.write("runs/F/1/a.json", b"1")
    s3.write("runs/F/1/b.json", b"2")
    s3.write("runs/F/10/a.json", b"3")
    s3.put_bytes(b"never listed")
    assert s3.read("runs/F/1/b.json") == b"2"
    assert s3.exists("runs/F/1/a.json") and not s3.exists("runs/F/1/c.json")
    assert s3.list("runs/F/1/") == ["runs/F/1/a.json", "runs/F/1/b.json"]
    assert s3.list() == ["runs/F/1/a.json", "runs/F/1/b.json", "runs/F/10/a.json"]
    s3.write("runs/F/1/a.json", b"replaced")
    assert s3.read("runs/F/1/a.json") == b"replaced"
    s3.delete("runs/F/1/a.json")
    with pytest.raises(StoreError, match="'runs/F/1/a.json' does not exist"):
        s3.read("runs/F/1/a.json")
    assert s3.local_path("x") is None
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="stoker-test", Prefix="team/proj/runs/")["Contents"]]
    assert "team/proj/runs/F/1/b.json" in keys


def test_artifacts_and_manifest_through_s3(s3):
    arr = np.random.default_rng(0).standard_normal((300, 200)).astype(np.float32)
    desc = save_artifact(s3, {"w": arr, "step": 3})
    out = load_artifact(s3, desc)
    assert out["step"] == 3 and np.array_equal(out["w"], arr)
    manifest = {"flow": "F", "run_id": "1", "step": "start", "task_id": "1", "attempt": 0, "status": "ok",
                "started_at": 1.0, "finished_at": 2.0, "artifacts": {"x": desc}}
    write_manifest(s3, manifest)
    assert read_manifest(s3, "F", "1", "start", "1", 0)["artifacts"]["x"] == desc


def test_endpoint_from_environment_and_missing_bucket(endpoint, client, monkeypatch, tmp_path):
    monkeypatch.setenv("STOKER_S3_ENDPOINT_URL", endpoint)
    store = open_store("s3://stoker-test/env", cache_dir=tmp_path / "c")  # client built from the env
    store.write("a", b"1")
    assert client.get_object(Bucket="stoker-test", Key="env/a")["Body"].read() == b"1"
    absent = open_store("s3://no-such-bucket", client=client, cache_dir=tmp_path / "c")
    with pytest.raises(StoreError, match="Check the bucket exists"):
        absent.write("a", b"1")


class _PrefixOnlyRole:
    """A client as a job role limited to the store's prefix sees S3: a missing key answers 403, not 404 (S3
    does so without s3:ListBucket on the bucket). moto enforces no IAM, so the 403 is made here, from moto's
    own 404; everything else is moto's."""

    def __init__(self, client) -> None:
        self.client = client

    def __getattr__(self, name):
        fn = getattr(self.client, name)
        if name not in ("head_object", "get_object"):
            return fn

        def call(**kw):
            try:
                return fn(**kw)
            except self.client.exceptions.ClientError as e:
                if e.response["Error"]["Code"] in ("404", "NoSuchKey", "NotFound"):
                    raise self.client.exceptions.ClientError(
                        {"Error": {"Code": "403", "Message": "Forbidden"}}, name) from None
                raise
        return call


def test_a_missing_key_seen_as_403_is_missing(client, tmp_path):
    s3 = open_store("s3://stoker-test/team/proj", client=_PrefixOnlyRole(client), cache_dir=tmp_path / "cache")
    assert not s3.exists("runs/F/1/nothing")
    key = s3.put_bytes(b"payload")  # checks whether the blob is there first
    assert s3.get_bytes(key) == b"payload" and s3.exists("runs/F/1/nothing") is False
    with pytest.raises(StoreError, match="does not exist"):
        s3.read("runs/F/1/nothing")


def test_the_blob_store_on_a_second_s3_server(rclone_s3, tmp_path):
    """Blobs, named objects, artifacts and a signed manifest through rclone's S3 server (Go), not only moto;
    a blob damaged in the bucket is refused by its content address."""
    store = open_store(f"s3://{rclone_s3}/team/proj", cache_dir=tmp_path / "cache")
    big = os.urandom(20 << 20)  # parallel multipart up, ranged GETs down
    key = store.put_stream([big[: 1 << 20], memoryview(big)[1 << 20:]])
    assert key == hashlib.sha256(big).hexdigest() and store.has_blob(key)
    assert store.get_bytes(key) == big and store.blob_path(key).read_bytes() == big
    desc = save_artifact(store, {"a": np.arange(10)})
    write_manifest(store, {"flow": "F", "run_id": "1", "step": "start", "task_id": "1", "attempt": 0,
                           "status": "ok", "started_at": 1.0, "finished_at": 2.0, "artifacts": {"x": desc}})
    got = read_manifest(store, "F", "1", "start", "1", 0)["artifacts"]["x"]
    assert got == desc and np.array_equal(load_artifact(store, got)["a"], np.arange(10))
    small = store.put_bytes(b"hello")
    store.objects.put_bytes(f"blobs/{small[:2]}/{small}", b"jello")  # damaged in storage, same size
    with pytest.raises(StoreError, match=small[:12]):
        open_store(f"s3://{rclone_s3}/team/proj", cache_dir=tmp_path / "cache2").get_bytes(small)
