"""``prepare(format="hf")`` / ``--format hf``: a Hugging Face save_to_disk folder (what NeuronX Distributed's
Llama pre-training example loads with ``datasets.load_from_disk``) holding the same blocks as stoker's shards."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from stoker.data import DataError, open_dataset, prepare
from stoker.data.hf_export import IGNORE_INDEX, hf_dataset_path, load_hf_dataset
from stoker.errors import ConfigError

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")

# NxD examples/training/llama/get_dataset.py: tokenizer(...) gives input_ids (int32) + attention_mask (int8),
# group_texts adds labels = input_ids (int64); datasets <= 3.6 (NxD's pin) serializes them as Sequence
NXD_FEATURES = {name: {"feature": {"dtype": dtype, "_type": "Value"}, "_type": "Sequence"}
                for name, dtype in (("input_ids", "int32"), ("attention_mask", "int8"), ("labels", "int64"))}


def blocks(ref, split="train") -> np.ndarray:
    ds = open_dataset(ref, split=split, verify="full")
    return np.stack([ds[i] for i in range(len(ds))]).astype(np.int64)


def rows(hf_ds, column="input_ids") -> np.ndarray:
    return np.asarray(hf_ds.with_format("numpy")[column], dtype=np.int64)


def check_nxd_columns(ds, block_size: int) -> None:
    assert ds.column_names == ["input_ids", "attention_mask", "labels"]
    assert {k: v.feature.dtype for k, v in ds.features.items()} == {
        "input_ids": "int32", "attention_mask": "int8", "labels": "int64"}
    assert {len(r) for r in ds["input_ids"]} == {block_size}
    schema = ds.data.schema
    assert [str(schema.field(c).type) for c in ds.column_names] == ["list<item: int32>", "list<item: int8>",
                                                                     "list<item: int64>"]


def test_hf_rows_equal_stoker_shards(tmp_path, jsonl_file):
    common = dict(block_size=64, val_fraction=0.2, shard_mb=64 * 13 * 3 / 2**20)  # 3 hf rows per arrow shard
    hf = prepare(str(jsonl_file), tokenizer="llama", output=str(tmp_path / "hf"), format="hf", **common)
    ref = prepare(str(jsonl_file), tokenizer="llama", output=str(tmp_path / "st"), **common)
    assert hf.format == "hf" and ref.format == "stoker" and hf.fingerprint != ref.fingerprint
    assert hf.url == str(tmp_path / "hf") and hf.splits == ["train", "val"]

    ds = datasets.load_from_disk(hf.url)  # exactly NxD's create_llama_pretraining_dataset(data_dir)
    check_nxd_columns(ds, 64)
    assert np.array_equal(rows(ds), blocks(ref))  # row for row the same tokens as stoker's shards
    assert np.array_equal(rows(ds, "labels"), rows(ds)) and (rows(ds, "attention_mask") == 1).all()
    val = load_hf_dataset(hf, "val")
    assert np.array_equal(rows(val), blocks(ref, "val")) and len(val) == hf.num_blocks("val")
    assert len(ds) == hf.num_blocks() == ref.num_blocks() and len(hf.manifest["splits"]["train"]["shards"]) > 1

    folder = tmp_path / "hf"
    assert json.loads((folder / "dataset_info.json").read_text())["features"] == NXD_FEATURES
    state = json.loads((folder / "state.json").read_text())
    n = len(state["_data_files"])
    assert [f["filename"] for f in state["_data_files"]] == [f"data-{i:05d}-of-{n:05d}.arrow" for i in range(n)]
    with pa.OSFile(str(folder / state["_data_files"][0]["filename"])) as f:  # an arrow IPC stream, as datasets
        schema = pa.ipc.open_stream(f).schema
    assert json.loads(schema.metadata[b"huggingface"]) == {"info": {"features": NXD_FEATURES}}
    # the manifest lists every file with its sha256, as stoker's shards are recorded
    m = hf.manifest
    assert m["format"] == "stoker.hf/1" and m["columns"] == {"input_ids": "int32", "attention_mask": "int8",
                                                             "labels": "int64"}
    on_disk = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert sorted([f["path"] for f in m["files"]] + ["manifest.json"]) == on_disk
    from stoker._hashing import sha256_file

    assert all(sha256_file(folder / f["path"]) == f["sha256"] for f in m["files"])

    stamp = os.stat(folder / "manifest.json").st_mtime_ns
    again = prepare(str(jsonl_file), tokenizer="llama", output=str(folder), format="hf", **common)
    assert again.manifest == m and os.stat(folder / "manifest.json").st_mtime_ns == stamp  # cache hit
    with pytest.raises(DataError, match="--format hf.*load_from_disk"):
        open_dataset(hf)
    with pytest.raises(DataError, match="stoker-format dataset"):
        hf_dataset_path(ref)
    with pytest.raises(DataError, match="already holds another dataset"):  # same folder, other format
        prepare(str(jsonl_file), tokenizer="llama", output=str(folder), **common)


def test_hf_padded_remainder_is_masked(tmp_path, jsonl_file):
    hf = prepare(str(jsonl_file), block_size=100, val_fraction=0, remainder="pad", output=str(tmp_path / "o"),
                 format="hf")
    ref = prepare(str(jsonl_file), block_size=100, val_fraction=0, remainder="pad", output=str(tmp_path / "s"))
    ds = load_hf_dataset(hf)
    assert np.array_equal(rows(ds), blocks(ref))
    pad = hf.manifest["splits"]["train"]["padded_tokens"]
    mask, labels = rows(ds, "attention_mask"), rows(ds, "labels")
    assert 0 < pad < 100 and (mask[-1, -pad:] == 0).all() and (mask[-1, :-pad] == 1).all() and (mask[:-1] == 1).all()
    assert (labels[-1, -pad:] == IGNORE_INDEX).all() and np.array_equal(labels[:, :-pad], rows(ds)[:, :-pad])


@pytest.mark.parametrize("options, match", [
    ({"format": "parquet"}, r"format='parquet'.*'stoker'.*'hf'.*--format hf"),
    ({"format": "hf", "block_size": 1}, r"block_size=1: must be an integer >= 2"),
])
def test_bad_options_are_one_config_error(tmp_path, jsonl_file, options, match):
    options = {"block_size": 32, **options}
    with pytest.raises(ConfigError, match=match):
        prepare(str(jsonl_file), output=str(tmp_path / "o"), **options)
    assert not (tmp_path / "o").exists()


def test_cli_format_hf(tmp_path, jsonl_file):
    env = {**os.environ, "STOKER_HOME": str(tmp_path / "home")}
    out = tmp_path / "nxd-data"
    run = subprocess.run([sys.executable, "-m", "stoker.cli.main", "data", "prepare", str(jsonl_file), "-b", "32",
                          "--val-fraction", "0", "--format", "hf", "-o", str(out), "--json"],
                         capture_output=True, text=True, env=env, timeout=180)
    assert run.returncode == 0, run.stderr
    info = json.loads(run.stdout)
    assert info["url"] == str(out) and info["format"] == "hf" and info["splits"] == ["train"]
    ds = datasets.load_from_disk(str(out))
    check_nxd_columns(ds, 32)
    assert len(ds) == info["num_tokens"] // 32
    ref = prepare(str(jsonl_file), block_size=32, val_fraction=0, output=str(tmp_path / "st"))
    assert np.array_equal(rows(ds), blocks(ref))
    bad = subprocess.run([sys.executable, "-m", "stoker.cli.main", "data", "prepare", str(jsonl_file),
                          "--format", "arrow"], capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and "invalid choice: 'arrow'" in bad.stderr


@pytest.mark.aws
def test_hf_to_s3_uploads_the_folder_and_downloads_verified(tmp_path, jsonl_file, s3, monkeypatch):
    url = "s3://data/nxd/shk"
    ref = prepare(str(jsonl_file), block_size=32, val_fraction=0.2, output=url, format="hf")
    assert ref.url == url and ref.format == "hf"
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="data", Prefix="nxd/")["Contents"])
    assert keys == sorted(["nxd/shk/manifest.json"] + [f"nxd/shk/{f['path']}" for f in ref.manifest["files"]])
    assert {"nxd/shk/dataset_info.json", "nxd/shk/state.json", "nxd/shk/data-00000-of-00001.arrow",
            "nxd/shk/val/state.json"} <= set(keys)
    local = prepare(str(jsonl_file), block_size=32, val_fraction=0.2, output=str(tmp_path / "st"))
    ds = load_hf_dataset(url)  # downloaded once into $STOKER_HOME/cache, every file's sha256 checked
    check_nxd_columns(ds, 32)
    assert np.array_equal(rows(ds), blocks(local))
    assert np.array_equal(rows(load_hf_dataset(url, "val")), blocks(local, "val"))
    assert prepare(str(jsonl_file), block_size=32, val_fraction=0.2, output=url, format="hf").manifest == \
        ref.manifest  # cache hit on the object store

    s3.put_object(Bucket="data", Key="nxd/shk/state.json", Body=b"{}")  # tampered after the commit
    monkeypatch.setenv("STOKER_HOME", str(tmp_path / "home2"))  # a fresh cache: download again
    with pytest.raises(DataError, match=r"state.json is corrupted: its content hashes to"):
        hf_dataset_path(url)
