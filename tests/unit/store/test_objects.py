"""The one object-store layer (stoker.store.objects): local folders, S3 (moto's server on loopback, a real
HTTP S3 API) and fsspec's memory filesystem behave alike; large objects move as parallel parts."""

from __future__ import annotations

import hashlib
import os

import pytest

from stoker.errors import ConfigError, DataError, StoreError
from stoker.store.objects import LocalObjects, MiB, TransferConfig, open_objects, parse_bytes

SMALL = TransferConfig(part_size=5 * MiB, concurrency=4)


@pytest.fixture()
def bucket(aws):
    aws.client("s3").create_bucket(Bucket="objs")
    return aws.client("s3")


@pytest.fixture(params=["local", "s3", "memory", "rclone"])
def store(request, tmp_path):
    """The same interface on a local folder, moto's S3, fsspec's memory filesystem and rclone's S3 server."""
    if request.param == "local":
        yield open_objects(tmp_path / "root", config=SMALL)
    elif request.param == "memory":
        fsspec = pytest.importorskip("fsspec")
        yield open_objects(f"memory://objs-{os.getpid()}/{tmp_path.name}", config=SMALL)
        fsspec.filesystem("memory").rm(f"/objs-{os.getpid()}", recursive=True)
    elif request.param == "rclone":
        yield open_objects(f"s3://{request.getfixturevalue('rclone_s3')}/pre/fix", config=SMALL)
    else:
        request.getfixturevalue("bucket")
        yield open_objects("s3://objs/pre/fix", config=SMALL)


def test_the_interface_on_every_backend(store, tmp_path):
    assert store.size("a/b.txt") is None and not store.exists("a/b.txt")
    assert store.try_get_bytes("a/b.txt") is None
    store.put_bytes("a/b.txt", b"hello world")
    store.put_bytes("a/c.txt", b"")
    store.put_bytes("ab.txt", b"x")
    assert store.get_bytes("a/b.txt") == b"hello world" and store.get_bytes("a/c.txt") == b""
    assert store.get_range("a/b.txt", 6, 5) == b"world" and store.size("a/b.txt") == 11
    assert [o.key for o in store.list("a/")] == ["a/b.txt", "a/c.txt"]
    assert [o.key for o in store.list("a")] == ["a/b.txt", "a/c.txt", "ab.txt"]
    src = tmp_path / "src.bin"
    src.write_bytes(b"file content")
    store.put_file("f/src.bin", src)
    store.get_file("f/src.bin", tmp_path / "back.bin", sha256=hashlib.sha256(b"file content").hexdigest())
    assert (tmp_path / "back.bin").read_bytes() == b"file content"
    with pytest.raises(StoreError, match=r"f/src\.bin is corrupted.*discarded"):
        store.get_file("f/src.bin", tmp_path / "bad.bin", sha256="0" * 64)
    assert not (tmp_path / "bad.bin").exists() and not list(tmp_path.glob("bad.bin*"))
    with pytest.raises(StoreError, match=r"nothing does not exist"):
        store.get_bytes("nothing")
    store.delete("a/b.txt")
    store.delete("a/b.txt")  # missing: no error
    assert not store.exists("a/b.txt")
    store.delete_many(["a/c.txt", "ab.txt"])
    assert [o.key for o in store.list()] == ["f/src.bin"]
    with pytest.raises(StoreError, match="not an object key"):
        store.put_bytes("../escape", b"x")


def test_many_objects_move_on_a_pool(store, tmp_path):
    files = []
    for i in range(20):
        (tmp_path / f"{i}.bin").write_bytes(bytes([i]) * (i + 1))
        files.append((f"many/{i:02d}.bin", tmp_path / f"{i}.bin"))
    store.put_many(files)
    out = tmp_path / "out"
    out.mkdir()
    store.get_many([(key, out / key.split("/")[1], hashlib.sha256(path.read_bytes()).hexdigest())
                    for key, path in files])
    assert all((out / f"{i:02d}.bin").read_bytes() == bytes([i]) * (i + 1) for i in range(20))


@pytest.mark.aws
def test_large_objects_go_in_parallel_parts_on_s3(bucket, tmp_path):
    store = open_objects("s3://objs/big", config=SMALL)
    data = os.urandom(12 * MiB + 123)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    store.put_file("big.bin", src)
    head = bucket.head_object(Bucket="objs", Key="big/big.bin", ChecksumMode="ENABLED")
    assert head["ContentLength"] == len(data) and head["ETag"].strip('"').endswith("-3")  # 3 parts
    # as boto3's upload_file does: CRC32 per part, checked by the server, combined for the object
    assert head.get("ChecksumCRC32")
    store.get_file("big.bin", tmp_path / "back.bin", sha256=hashlib.sha256(data).hexdigest())
    assert (tmp_path / "back.bin").read_bytes() == data
    assert store.get_bytes("big.bin") == data
    assert store.get_range("big.bin", 5 * MiB - 3, 10) == data[5 * MiB - 3:5 * MiB + 7]
    store.put_bytes("mem.bin", memoryview(data))
    assert bucket.head_object(Bucket="objs", Key="big/mem.bin")["ETag"].strip('"').endswith("-3")
    assert store.get_bytes("mem.bin", sha256=hashlib.sha256(data).hexdigest()) == data
    assert not bucket.list_multipart_uploads(Bucket="objs").get("Uploads")


def test_get_buffer_hands_over_the_downloaded_memory(store):
    """get_buffer (checkpoint shards): the same content as get_bytes, verified; on S3 a large object is the
    read-only memory its parts landed in (no copy into bytes), a small one plain bytes."""
    data = os.urandom(11 * MiB + 5)
    store.put_bytes("buf/big", data)
    store.put_bytes("buf/small", b"tiny")
    got = store.get_buffer("buf/big", sha256=hashlib.sha256(data).hexdigest())
    assert bytes(got) == data and store.get_buffer("buf/small") == b"tiny"
    if getattr(store, "client", None) is not None:
        assert isinstance(got, memoryview) and got.readonly
        with pytest.raises(TypeError):
            got[0] = 1
    with pytest.raises(StoreError, match="is corrupted"):
        store.get_buffer("buf/big", sha256="0" * 64)
    with pytest.raises(StoreError, match="does not exist"):
        store.get_buffer("buf/none")


@pytest.mark.aws
def test_nested_s3_transfers_share_the_concurrency(bucket, tmp_path):
    """put_many/get_many of large files (each a parallel multipart upload or ranged download) and streamed
    uploads running beside them keep at most ``concurrency`` parts in flight together, not concurrency^2:
    counted with botocore's own events around each request, against moto's server."""
    import threading
    import time

    store = open_objects("s3://objs/nest", config=TransferConfig(part_size=5 * MiB, concurrency=2))
    lock, now, peak = threading.Lock(), {"n": 0}, {"n": 0}

    def enter(params, context, **_):
        if str(params["headers"].get("Range", "")).startswith("bytes=0-"):  # params: the request as sent
            return  # the first GET of a file (one per file, outside the bound): only later ranges count
        context["counted"] = True
        with lock:
            now["n"] += 1
            peak["n"] = max(peak["n"], now["n"])
        time.sleep(0.05)  # long enough that parts of different files would overlap

    def leave(context, **_):
        if context.get("counted"):
            with lock:
                now["n"] -= 1

    events = store.client.meta.events
    events.register("before-call.s3.UploadPart", enter)
    events.register("after-call.s3.UploadPart", leave)
    files = []
    for i in range(3):
        (tmp_path / f"{i}.bin").write_bytes(os.urandom(3 * 5 * MiB))
        files.append((f"{i}.bin", tmp_path / f"{i}.bin"))
    streamed = threading.Thread(target=lambda: store.put_bytes("streamed.bin", os.urandom(3 * 5 * MiB)))
    streamed.start()
    store.put_many(files)
    streamed.join()
    assert peak["n"] == 2, f"{peak['n']} parts in flight at once with concurrency=2"
    peak["n"] = 0
    events.register("before-call.s3.GetObject", enter)
    events.register("after-call.s3.GetObject", leave)
    store.get_many([(key, tmp_path / f"back-{key}", None) for key, _ in files])
    assert peak["n"] == 2, f"{peak['n']} ranged GETs in flight at once with concurrency=2"
    assert all((tmp_path / f"back-{key}").read_bytes() == path.read_bytes() for key, path in files)


@pytest.mark.aws
def test_s3_errors_name_the_url_and_the_fix(aws, tmp_path):
    store = open_objects("s3://no-such-bucket/p", error=DataError)
    with pytest.raises(DataError, match=r"s3://no-such-bucket/p/x: writing failed.*Check the bucket exists"):
        store.put_bytes("x", b"1")
    with pytest.raises(DataError, match=r"s3://no-such-bucket/p: listing failed"):
        store.list("")
    with pytest.raises(ConfigError, match="S3 parts are at least 5MiB"):
        TransferConfig(part_size=1 * MiB)


def test_configuration_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("STOKER_S3_ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("STOKER_S3_PART_SIZE", "64MiB")
    monkeypatch.setenv("STOKER_S3_CONCURRENCY", "32")
    monkeypatch.setenv("STOKER_S3_REGION", "eu-west-1")
    cfg = TransferConfig.from_env()
    assert (cfg.endpoint_url, cfg.part_size, cfg.multipart_threshold, cfg.concurrency, cfg.region) == (
        "http://127.0.0.1:9000", 64 * MiB, 64 * MiB, 32, "eu-west-1")
    monkeypatch.setenv("STOKER_S3_CONCURRENCY", "many")
    with pytest.raises(ConfigError, match="STOKER_S3_CONCURRENCY='many' is not a whole number"):
        TransferConfig.from_env()
    assert parse_bytes("8", "X") == 8 and parse_bytes("2GiB", "X") == 2 << 30
    with pytest.raises(ConfigError, match=r"X='lots' is not a size.*X=16MiB"):
        parse_bytes("lots", "X")


@pytest.mark.aws
def test_the_client_honours_endpoint_and_profile(aws, monkeypatch, tmp_path):
    from stoker.store.objects.s3 import s3_client

    client = s3_client(StoreError, "test", TransferConfig.from_env())
    assert client.meta.endpoint_url == aws.endpoint
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(StoreError, match=r"profile 'nope' \(STOKER_S3_PROFILE\) is unusable"):
        s3_client(StoreError, "test", TransferConfig(profile="nope"))


def test_a_local_store_writes_atomically(tmp_path):
    store = LocalObjects(tmp_path)
    store.put_bytes("x/y", b"1")
    store.put_bytes("x/y", b"22")
    assert (tmp_path / "x" / "y").read_bytes() == b"22" and sorted(os.listdir(tmp_path / "x")) == ["y"]
    assert store.local_root == tmp_path.resolve()


def test_streamed_uploads_commit_on_close_and_discard_on_error(store):
    data = os.urandom(11 * MiB + 5)
    with store.open_write("s/big") as f:
        for i in range(0, len(data), 3 * MiB):
            f.write(data[i:i + 3 * MiB])
        assert f.tell() == len(data)
    assert f.sha256 == hashlib.sha256(data).hexdigest() and f.size == len(data)
    assert store.get_bytes("s/big") == data
    if getattr(store, "client", None) is not None and store.bucket == "objs":  # (moto keeps checksums as AWS does)
        head = store.client.head_object(Bucket=store.bucket, Key=store.s3key("s/big"), ChecksumMode="ENABLED")
        assert head.get("ChecksumCRC32") and head["ETag"].strip('"').endswith("-3")
    with store.open_write("s/small") as f:
        f.write(b"abc")
    assert store.get_bytes("s/small") == b"abc"
    with pytest.raises(RuntimeError), store.open_write("s/torn") as f:
        f.write(data)
        raise RuntimeError("writer died")
    assert not store.exists("s/torn")
    if getattr(store, "client", None) is not None:
        assert not store.client.list_multipart_uploads(Bucket=store.bucket).get("Uploads")


def test_streamed_uploads_of_mixed_write_sizes(store):
    """Small writes gathered into parts, large ones (a tensor) cut into parts straight from the caller's buffer,
    a part topped up across writes: the object is every byte in order."""
    rng = os.urandom
    pieces = [rng(1), rng(5 * MiB - 1), rng(12 * MiB + 3), rng(7), rng(5 * MiB), b"", rng(2), rng(10 * MiB)]
    with store.open_write("mixed") as f:
        for p in pieces:
            f.write(p)
    data = b"".join(pieces)
    assert f.size == len(data) and f.sha256 == hashlib.sha256(data).hexdigest()
    assert store.get_bytes("mixed") == data


@pytest.mark.aws
def test_bodies_go_unsigned_with_a_signed_crc32(bucket, tmp_path):
    """Over plain http botocore would SHA256-sign every body (a second hash of every byte): stoker's uploads
    send UNSIGNED-PAYLOAD with a CRC32 checksum header instead, as botocore does over https."""
    store = open_objects("s3://objs/unsigned", config=SMALL)
    seen = []

    def record(request, **_):
        sig = request.headers.get("X-Amz-Content-SHA256")
        seen.append((sig.decode() if isinstance(sig, bytes) else sig, request.headers.get("x-amz-checksum-crc32")))

    store.client.meta.events.register("before-send.s3.UploadPart", record)
    store.client.meta.events.register("before-send.s3.PutObject", record)
    store.put_bytes("small", b"abc")
    store.put_bytes("large", os.urandom(6 * MiB))
    assert len(seen) == 3 and all(sig == "UNSIGNED-PAYLOAD" and crc for sig, crc in seen), seen
    assert store.get_bytes("large") and store.get_bytes("small") == b"abc"
