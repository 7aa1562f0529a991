"""Integrity of blobs read from S3 (moto's S3 server on loopback): a download must match its content
address, and a cached copy is checked before it is trusted."""

from __future__ import annotations

import hashlib
import logging
import os

import pytest

from stoker.errors import StoreError
from stoker.store import open_store

pytestmark = pytest.mark.aws

BUCKET = "integrity"


@pytest.fixture
def client(aws):
    c = aws.client("s3")
    c.create_bucket(Bucket=BUCKET)
    return c


@pytest.fixture
def s3(client, tmp_path):
    return open_store(f"s3://{BUCKET}/p", client=client, cache_dir=tmp_path / "cache")


def _object(key: str) -> str:
    return f"p/blobs/{key[:2]}/{key}"


def _cache_files(tmp_path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "cache").rglob("*") if p.is_file())


def test_a_blob_overwritten_in_s3_is_refused_and_not_cached(s3, client, tmp_path):
    """Another writer (or bit rot) replaced the object at a content address with other bytes."""
    good = os.urandom(50_000)
    key = s3.put_bytes(good)
    client.put_object(Bucket=BUCKET, Key=_object(key), Body=b"someone else's bytes")
    evil = hashlib.sha256(b"someone else's bytes").hexdigest()
    for read in (s3.blob_path, s3.get_bytes):
        with pytest.raises(StoreError) as info:
            read(key)
        msg = str(info.value)
        assert key in msg and evil in msg and "corrupted" in msg and "re-run the step" in msg
    assert _cache_files(tmp_path) == []  # nothing corrupted is left in the cache (nor temp files)
    assert s3.verify_blob(key) is False
    client.put_object(Bucket=BUCKET, Key=_object(key), Body=good)  # restored: readable again
    assert s3.blob_path(key).read_bytes() == good and s3.get_bytes(key) == good
    assert s3.verify_blob(key) is True


def test_a_torn_cached_copy_is_detected_and_downloaded_again(s3, tmp_path, caplog):
    data = os.urandom(200_000)
    key = s3.put_stream([data])  # the upload is kept in the cache
    path = s3.blob_path(key)
    assert path.is_relative_to(tmp_path / "cache") and path.read_bytes() == data
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:  # a power cut (the cache is not fsynced) or a full disk tore it
        f.truncate(1000)
    with caplog.at_level(logging.WARNING, logger="stoker.store.blobs"):
        assert s3.get_bytes(key) == data  # not the torn 1000 bytes
    assert key in caplog.text and "damaged" in caplog.text
    with open(path, "ab") as f:  # too long this time
        f.write(b"junk")
    assert s3.blob_path(key).read_bytes() == data
    assert oct(path.stat().st_mode & 0o777) == oct(0o444)


def test_a_cached_copy_without_a_size_record_is_hashed(s3, tmp_path):
    """A cached copy whose size record is missing (a cache from before records, or a lost record) is
    hashed before use: a flipped byte is caught even though the size is right."""
    data = os.urandom(10_000)
    key = s3.put_stream([data])
    path = s3.blob_path(key)
    (path.parent / f"{key}.size").unlink(missing_ok=True)
    os.chmod(path, 0o644)
    damaged = bytearray(data)
    damaged[1234] ^= 0xFF
    path.write_bytes(bytes(damaged))
    assert s3.blob_path(key).read_bytes() == data
    assert (path.parent / f"{key}.size").read_text() == str(len(data))


def test_a_damaged_cache_over_a_corrupted_object_raises(s3, client, tmp_path):
    data = b"original" * 1000
    key = s3.put_stream([data])
    path = s3.blob_path(key)
    os.chmod(path, 0o644)
    path.write_bytes(b"torn")
    client.put_object(Bucket=BUCKET, Key=_object(key), Body=b"replaced")
    with pytest.raises(StoreError, match=f"blob {key} .* is corrupted"):
        s3.blob_path(key)
    assert _cache_files(tmp_path) == []
