"""open_dataset(): memory-mapped blocks, checksum verification (lazy and full), clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from stoker.data import DataError, open_dataset, prepare


@pytest.fixture()
def ref(tmp_path, jsonl_file):
    return prepare(str(jsonl_file), block_size=32, val_fraction=0.25, output=str(tmp_path / "ds"),
                   shard_mb=32 * 2 * 8 / 2**20)  # 8 blocks per shard


def test_blocks_and_metadata(ref):
    ds = open_dataset(ref)
    assert len(ds) == ref.num_blocks("train") > 8 and ds.block_size == 32 and ds.vocab_size == 32000
    assert ds[0].shape == (32,) and ds[0].dtype == np.uint16 and ds[0][0] == 1  # BOS opens the stream
    assert np.array_equal(ds[-1], ds[len(ds) - 1])
    batch = ds.get_batch([0, 9, 3])
    assert batch.dtype == np.int64 and batch.shape == (3, 32) and np.array_equal(batch[1], ds[9])
    with pytest.raises(IndexError):
        ds[len(ds)]
    val = open_dataset(ref.url, split="val")
    assert len(val) == ref.num_blocks("val") > 0 and val.manifest is ref.manifest or val.manifest == ref.manifest


def corrupt(ref, shard=1):
    path = ref.path / ref.manifest["splits"]["train"]["shards"][shard]["path"]
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


def test_checksum_mismatch_full(ref):
    path = corrupt(ref)
    with pytest.raises(DataError, match=f"{path}: checksum mismatch.*overwrite=True"):
        open_dataset(ref, verify="full")


def test_checksum_mismatch_lazy_on_first_access(ref):
    corrupt(ref, shard=1)
    ds = open_dataset(ref)  # lazy: opening is cheap
    assert ds[0][0] == 1  # shard 0 is intact
    with pytest.raises(DataError, match="checksum mismatch"):
        ds[8]  # first block of shard 1
    assert len(open_dataset(ref, verify="none")[8]) == 32


def test_truncated_or_missing_shard(ref):
    path = ref.path / ref.manifest["splits"]["train"]["shards"][0]["path"]
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(DataError, match="bytes, the manifest says"):
        open_dataset(ref)
    path.unlink()
    with pytest.raises(DataError, match="is missing from the dataset"):
        open_dataset(ref)


def test_not_a_dataset_and_missing_split(tmp_path, ref):
    with pytest.raises(DataError, match="holds no manifest.json.*stoker data prepare"):
        open_dataset(tmp_path / "nothing")
    with pytest.raises(DataError, match="no 'test' split"):
        open_dataset(ref, split="test")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "manifest.json").write_text("{oops")
    with pytest.raises(DataError, match="not valid JSON"):
        open_dataset(tmp_path / "bad")
