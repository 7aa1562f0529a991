"""The stream DCP reads a downloaded shard through (stoker.train.checkpoint_objects.BufferStream): it behaves as
io.BytesIO over the same bytes for every read/seek DCP and torch.load use, without copying the buffer, and
closing it lets go of the buffer."""

from __future__ import annotations

import io
import mmap
import random

import pytest
import torch

from stoker.train.checkpoint_objects import BufferStream


def test_reads_and_seeks_as_bytesio_does():
    data = random.Random(0).randbytes(10_000)
    ours, ref = BufferStream(memoryview(data)), io.BytesIO(data)
    rng = random.Random(1)
    for _ in range(500):
        op = rng.choice(["read", "readinto", "seek", "seek_cur", "seek_end", "tell"])
        if op == "read":
            n = rng.choice([-1, 0, 1, 7, 4096, 20_000])
            assert ours.read(n) == ref.read(n)
        elif op == "readinto":
            a = bytearray(rng.randint(0, 3000))
            b = bytearray(len(a))
            assert ours.readinto(a) == ref.readinto(b) and a == b
        elif op == "seek":
            pos = rng.randint(0, 12_000)
            assert ours.seek(pos) == ref.seek(pos)
        elif op == "seek_cur":
            off = rng.randint(-ours.tell(), 500)
            assert ours.seek(off, io.SEEK_CUR) == ref.seek(off, io.SEEK_CUR)
        elif op == "seek_end":
            off = -rng.randint(0, 10_000)
            assert ours.seek(off, io.SEEK_END) == ref.seek(off, io.SEEK_END)
        assert ours.tell() == ref.tell()
    with pytest.raises(ValueError):
        ours.seek(-1)


def test_torch_loads_from_it_and_closing_frees_the_buffer():
    buf = io.BytesIO()
    tensors = {"w": torch.randn(64, 32), "step": torch.tensor(7)}
    torch.save(tensors, buf)
    raw = buf.getvalue()
    area = mmap.mmap(-1, len(raw), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # as get_buffer hands it over
    area[:] = raw
    view = memoryview(area).toreadonly()
    stream = BufferStream(view)
    del view
    back = torch.load(stream, weights_only=True)
    assert torch.equal(back["w"], tensors["w"]) and int(back["step"]) == 7
    stream.close()
    with pytest.raises(ValueError):
        stream.read(1)
    area.close()  # nothing holds an export of it any more (it would raise BufferError)


def test_a_shard_of_the_wrong_size_or_content_is_refused_in_one_line(tmp_path):
    """What the reader says when a shard does not match the manifest (the size is checked before the content)."""
    import hashlib

    from stoker.errors import CheckpointError
    from stoker.store.objects import open_objects
    from stoker.train.checkpoint_objects import ObjectFileSystem

    objects = open_objects(tmp_path, error=CheckpointError)
    objects.put_bytes("ck/__0_0.distcp", b"x" * 100)
    good = {"sha256": hashlib.sha256(b"x" * 100).hexdigest(), "bytes": 100}
    fs = ObjectFileSystem(objects, expected={"__0_0.distcp": good}, root="ck")
    assert bytes(fs._fetch("ck/__0_0.distcp")) == b"x" * 100
    fs = ObjectFileSystem(objects, expected={"__0_0.distcp": {**good, "bytes": 90}}, root="ck")
    with pytest.raises(CheckpointError, match=r"__0_0\.distcp has 100 bytes, its manifest says 90: the checkpoint is "
                                              "truncated or corrupted; use an earlier one$"):
        fs._fetch("ck/__0_0.distcp")
    fs = ObjectFileSystem(objects, expected={"__0_0.distcp": {**good, "sha256": "0" * 64}}, root="ck")
    with pytest.raises(CheckpointError, match=r"__0_0\.distcp does not match its checksum in manifest\.json"):
        fs._fetch("ck/__0_0.distcp")
