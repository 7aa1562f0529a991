"""The sha256 computed while a download's parts land out of order (stoker.store.objects.prefix_hash), and the S3 store
using it: get_file / get_buffer verify without a second pass over the object, a wrong size is refused after
the first GET."""

from __future__ import annotations

import hashlib
import os
import random
import threading

import pytest

from stoker.errors import StoreError
from stoker.store.objects import MiB, TransferConfig, open_objects
from stoker.store.objects import base as objects_base
from stoker.store.objects.prefix_hash import PrefixHash


def test_spans_landing_in_any_order_from_many_threads():
    data = os.urandom(3 * MiB + 17)
    buf = bytearray(len(data))
    view = memoryview(buf)
    spans = []
    for start in range(0, len(data), 1 << 16):  # 49 spans of 64 KiB, 4 threads, shuffled
        spans.append((start, min(len(data), start + (1 << 16))))
    random.Random(0).shuffle(spans)
    h = PrefixHash(len(data), lambda off, n: view[off:off + n])

    def land(mine):
        for a, b in mine:
            view[a:b] = data[a:b]
            h.landed(a, b - a)

    threads = [threading.Thread(target=land, args=(spans[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert h.hexdigest() == hashlib.sha256(data).hexdigest()
    assert PrefixHash(0, lambda off, n: b"").hexdigest() == hashlib.sha256(b"").hexdigest()


def test_a_short_download_or_a_failing_read_never_hangs():
    h = PrefixHash(100, lambda off, n: b"x" * n)
    h.landed(0, 60)  # the rest never lands
    with pytest.raises(RuntimeError, match="60 of 100"):
        h.hexdigest()
    h = PrefixHash(100, lambda off, n: b"x" * n)
    h.landed(50, 50)
    h.stop()  # a failed download gives up: the thread ends
    assert not h._thread.is_alive()

    def broken(off, n):
        raise OSError("read back failed")

    h = PrefixHash(10, broken)
    h.landed(0, 10)
    with pytest.raises(OSError, match="read back failed"):
        h.hexdigest()


@pytest.mark.aws
def test_s3_downloads_are_verified_on_the_way(aws, tmp_path, monkeypatch):
    aws.client("s3").create_bucket(Bucket="prefixhash")
    store = open_objects("s3://prefixhash/x", config=TransferConfig(part_size=5 * MiB, concurrency=4))
    data = os.urandom(17 * MiB + 3)  # four ranged parts
    store.put_bytes("big", data)
    digest = hashlib.sha256(data).hexdigest()

    def no_second_pass(path):
        raise AssertionError(f"{path} was hashed again after the download")

    monkeypatch.setattr(objects_base, "sha256_file", no_second_pass)
    store.get_file("big", tmp_path / "big", sha256=digest)
    assert (tmp_path / "big").read_bytes() == data
    assert bytes(store.get_buffer("big", sha256=digest, size=len(data))) == data
    with pytest.raises(StoreError, match="is corrupted"):
        store.get_file("big", tmp_path / "bad", sha256="0" * 64)
    assert not list(tmp_path.glob("bad*"))
    with pytest.raises(StoreError, match="is corrupted"):
        store.get_buffer("big", sha256="0" * 64)

    gets = []
    store.client.meta.events.register("before-call.s3.GetObject", lambda **kw: gets.append(1))
    with pytest.raises(StoreError, match=f"has {len(data)} bytes, its record says 42"):
        store.get_buffer("big", sha256=digest, size=42)
    assert len(gets) == 1  # refused after the first GET: the other parts were never fetched
