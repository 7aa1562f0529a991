"""prepare(): exact packing, shards and checksums, caching, atomic commit, and clear errors."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest

from stoker.data import DataError, load_tokenizer, open_dataset, prepare
from stoker.data.pack import is_val_document, token_dtype


def expected_streams(docs, tok, val_fraction):
    streams = {"train": [], "val": []}
    for i, d in enumerate(docs):
        split = "val" if is_val_document(i, val_fraction) else "train"
        eos = [] if tok.eos_id == tok.bos_id else [tok.eos_id]  # GPT-2: one <|endoftext|>, before each doc
        streams[split] += [tok.bos_id, *tok.encode(d), *eos]
    return streams


def read_split(ref, split):
    ds = open_dataset(ref, split=split, verify="full")
    return np.concatenate([ds[i] for i in range(len(ds))]).tolist() if len(ds) else []


@pytest.mark.parametrize("tokenizer", ["llama", "gpt2"])
def test_packing_is_exact(tmp_path, docs, jsonl_file, tokenizer):
    tok = load_tokenizer(tokenizer)
    ref = prepare(str(jsonl_file), tokenizer=tokenizer, block_size=64, val_fraction=0.2,
                  output=str(tmp_path / "out"), shard_mb=64 * 2 * 5 / 2**20)  # 5 blocks per shard
    want = expected_streams(docs, tok, 0.2)
    m = ref.manifest
    assert m["dtype"] == "uint16" and ref.block_size == 64 and ref.vocab_size == tok.vocab_size
    for split in ("train", "val"):
        got = read_split(ref, split)
        s = m["splits"][split]
        # every token of every document, in order; only the stream's last partial block is dropped
        assert got == want[split][:len(got)]
        assert len(want[split]) - len(got) == s["dropped_tokens"] < 64
        assert s["num_tokens"] == len(got) == s["num_blocks"] * 64
    train = m["splits"]["train"]
    assert train["num_documents"] == sum(1 for i in range(len(docs)) if not is_val_document(i, 0.2))
    assert len(train["shards"]) == -(-train["num_blocks"] // 5) > 1
    assert all(s["num_blocks"] == 5 for s in train["shards"][:-1])
    # documents are packed across block boundaries: EOS then BOS sit inside blocks, not only at block starts
    stream = np.array(read_split(ref, "train"))
    bos_at = np.flatnonzero(stream == tok.bos_id)
    assert (bos_at % 64 != 0).any() and len(bos_at) == train["num_documents"]
    if tok.bos_id != tok.eos_id:  # every document but the first is preceded by the previous one's EOS
        assert (stream[bos_at[bos_at > 0] - 1] == tok.eos_id).all()
    assert ref.num_tokens == train["num_tokens"]


def test_remainder_pad_keeps_every_token(tmp_path, docs, jsonl_file):
    tok = load_tokenizer("llama")
    ref = prepare(str(jsonl_file), block_size=100, val_fraction=0, remainder="pad", output=str(tmp_path / "o"))
    want = expected_streams(docs, tok, 0)["train"]
    got = read_split(ref, "train")
    pad = ref.manifest["splits"]["train"]["padded_tokens"]
    assert got == want + [tok.eos_id] * pad and 0 < pad < 100 and len(got) % 100 == 0
    assert "val" not in ref.manifest["splits"]


def test_cache_hit_returns_at_once(tmp_path, text_folder):
    ref = prepare(str(text_folder), block_size=32, val_fraction=0)
    assert ref.path.parent == tmp_path / "stoker_home" / "datasets" and ref.path.name == ref.fingerprint
    stamp = os.stat(ref.path / "manifest.json").st_mtime_ns
    again = prepare(str(text_folder), block_size=32, val_fraction=0)
    assert again.fingerprint == ref.fingerprint and again.manifest == ref.manifest
    assert os.stat(ref.path / "manifest.json").st_mtime_ns == stamp  # nothing rewritten
    other = prepare(str(text_folder), block_size=48, val_fraction=0)
    assert other.fingerprint != ref.fingerprint
    (text_folder / "doc00.txt").write_text("changed text " * 50)
    assert prepare(str(text_folder), block_size=32, val_fraction=0).fingerprint != ref.fingerprint


def test_ref_is_picklable_and_summarises(tmp_path, jsonl_file):
    ref = prepare(str(jsonl_file), block_size=32, output=str(tmp_path / "d"), val_fraction=0)
    back = pickle.loads(pickle.dumps(ref))
    assert back == ref and back.url == str(tmp_path / "d") and back.num_tokens > 0
    on_disk = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert on_disk["tokenizer"]["fingerprint"] == load_tokenizer("llama").fingerprint
    assert len(on_disk["splits"]["train"]["shards"][0]["sha256"]) == 64


def test_failed_prepare_leaves_nothing(tmp_path, docs):
    folder = tmp_path / "c"
    folder.mkdir()
    for i, d in enumerate(docs):
        (folder / f"a{i:02d}.txt").write_text(d * 40)
    (folder / "z_bad.txt").write_bytes(b"ok \xff\xfe bad")
    with pytest.raises(DataError, match=r"z_bad\.txt: bytes"):
        prepare(str(folder), block_size=32, batch_chars=5000, output=str(tmp_path / "out"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]  # no out, no .out.tmp-*


def test_empty_corpus_and_block_too_large(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DataError, match="no documents"):
        prepare(str(empty))
    small = tmp_path / "small.txt"
    small.write_text("A short text.")
    with pytest.raises(DataError, match="fewer than block_size=256.*smaller --block-size"):
        prepare(str(small), block_size=256)
    assert not (tmp_path / "stoker_home" / "datasets").exists() or \
        not list((tmp_path / "stoker_home" / "datasets").iterdir())


def test_output_conflict_and_overwrite(tmp_path, jsonl_file, text_folder):
    out = str(tmp_path / "ds")
    prepare(str(jsonl_file), block_size=32, output=out, val_fraction=0)
    with pytest.raises(DataError, match="already holds another dataset.*overwrite=True"):
        prepare(str(text_folder), block_size=32, output=out, val_fraction=0)
    ref = prepare(str(text_folder), block_size=32, output=out, val_fraction=0, overwrite=True)
    assert open_dataset(out).manifest["fingerprint"] == ref.fingerprint


def test_fsspec_output_commit_and_download(tmp_path, jsonl_file):
    import fsspec

    url = "memory://bucket/ds1"
    ref = prepare(str(jsonl_file), block_size=32, output=url, val_fraction=0)
    fs = fsspec.filesystem("memory")
    assert fs.exists("/bucket/ds1/manifest.json") and ref.path is None
    ds = open_dataset(url, verify="full")
    local = prepare(str(jsonl_file), block_size=32, output=str(tmp_path / "l"), val_fraction=0)
    assert np.array_equal(ds[3], open_dataset(local)[3])
    assert prepare(str(jsonl_file), block_size=32, output=url, val_fraction=0).fingerprint == ref.fingerprint
    fs.rm("/bucket", recursive=True)


def test_long_documents_are_split_for_parallelism(tmp_path, docs):
    """Tokenizers that cannot spread one text over all cores get long documents cut at whitespace; the ids
    still decode to the whole text."""
    text = "\n".join(docs) * 3
    path = tmp_path / "long.txt"
    path.write_text(text)
    tok = load_tokenizer("gpt2")
    assert not tok.splits_long_texts
    ref = prepare(str(path), tokenizer="gpt2", block_size=16, val_fraction=0, max_doc_chars=2000,
                  remainder="pad", output=str(tmp_path / "o"))
    got = read_split(ref, "train")
    while got[-1] == tok.eos_id:  # the padding of the last block
        got.pop()
    assert got[0] == tok.bos_id and tok.decode(got[1:]) == text
    assert ref.manifest["splits"]["train"]["num_documents"] == 1


def test_long_documents_encode_exactly_with_the_word_cache(tmp_path, docs):
    text = "\n".join(docs) * 3
    path = tmp_path / "long.txt"
    path.write_text(text)
    tok = load_tokenizer("llama")
    assert tok.splits_long_texts
    ref = prepare(str(path), block_size=16, val_fraction=0, max_doc_chars=2000, remainder="pad",
                  output=str(tmp_path / "o"))
    got = read_split(ref, "train")
    assert got[:got.index(tok.eos_id) + 1] == [tok.bos_id, *tok.sp.encode(text), tok.eos_id]
    assert ref.manifest["splits"]["train"]["num_documents"] == 1


def test_token_dtype():
    assert token_dtype(32000) == np.uint16 and token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32 and token_dtype(128256) == np.uint32


def test_val_split_by_documents():
    chosen = [i for i in range(1000) if is_val_document(i, 0.01)]
    assert len(chosen) == 10 and all(b - a == 100 for a, b in zip(chosen, chosen[1:], strict=False))
    assert sum(is_val_document(i, 0.01) for i in range(77)) == 1
    assert not any(is_val_document(i, 0.0) for i in range(100))


@pytest.mark.slow
def test_concurrent_prepares_share_one_commit(tmp_path, jsonl_file):
    """Two processes (e.g. two ranks) preparing the same dataset: both succeed, one folder, no leftovers."""
    import subprocess
    import sys

    env = {**os.environ, "STOKER_HOME": str(tmp_path / "home")}
    cmd = [sys.executable, "-m", "stoker.data", "prepare", str(jsonl_file), "-b", "16", "-q"]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert outs[0][0] == outs[1][0]
    assert [p.name for p in (tmp_path / "home" / "datasets").iterdir()] == [os.path.basename(outs[0][0].strip())]


def test_large_vocabulary_uses_uint32(tmp_path, jsonl_file, docs):
    """A tiktoken vocabulary of 70k+ ids: ids above 65535 occur and survive in uint32 shards."""
    import base64
    import itertools

    tokens = [bytes([b]) for b in range(256)]
    tokens += [b"\xff\xfe" + bytes(p) for p in itertools.islice(itertools.product(range(256), repeat=2), 70000)]
    letters = b"abcdefghijklmnopqrstuvwxyz "
    tokens += [bytes([a, b]) for a in letters for b in letters]  # common pairs get ids > 70000
    path = tmp_path / "big.tiktoken"
    path.write_text("".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(tokens)))
    tok = load_tokenizer(path)
    assert tok.vocab_size == len(tokens) + 1 > 65536
    ref = prepare(str(jsonl_file), tokenizer=str(path), block_size=64, val_fraction=0, output=str(tmp_path / "o"))
    assert ref.manifest["dtype"] == "uint32"
    got = read_split(ref, "train")
    assert max(got) > 65535
    assert got == expected_streams(docs, tok, 0)["train"][:len(got)]


@pytest.mark.slow
def test_s3_output_against_loopback_server(tmp_path, jsonl_file, s3):
    """prepare -> s3:// (a real S3 API server on loopback, moto) -> open_dataset downloads and verifies."""
    ref = prepare(str(jsonl_file), block_size=32, val_fraction=0, output="s3://data/ds/shk")
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="data")["Contents"])
    assert keys == ["ds/shk/manifest.json", "ds/shk/train/shard-00000.bin"]
    ds = open_dataset("s3://data/ds/shk", verify="full")
    local = prepare(str(jsonl_file), block_size=32, val_fraction=0, output=str(tmp_path / "l"))
    assert len(ds) == len(open_dataset(local)) and np.array_equal(ds[2], open_dataset(local)[2])
    again = prepare(str(jsonl_file), block_size=32, val_fraction=0, output="s3://data/ds/shk")
    assert again.fingerprint == ref.fingerprint  # cache hit on the object store
    with pytest.raises(DataError, match="s3://nobucket/x.*failed.*bucket exists"):
        prepare(str(jsonl_file), block_size=32, val_fraction=0, output="s3://nobucket/x")


@pytest.mark.slow
def test_s3_output_on_a_second_s3_server(tmp_path, jsonl_file, rclone_s3):
    """The same round trip against rclone's S3 server (Go), not only moto: written, downloaded, verified."""
    url = f"s3://{rclone_s3}/ds/shk"
    ref = prepare(str(jsonl_file), block_size=32, val_fraction=0, output=url)
    ds = open_dataset(url, verify="full")
    local = open_dataset(prepare(str(jsonl_file), block_size=32, val_fraction=0, output=str(tmp_path / "l")))
    assert len(ds) == len(local) and all(np.array_equal(ds[i], local[i]) for i in range(len(ds)))
    assert prepare(str(jsonl_file), block_size=32, val_fraction=0, output=url).fingerprint == ref.fingerprint


def test_interrupted_prepare_leaves_nothing(tmp_path, docs):
    """Ctrl-C half way (after shards were written) removes the staging folder; nothing is committed."""
    from stoker.data.sources import Source

    class Interrupted(Source):
        def describe(self):
            return {"kind": "test-interrupted"}

        def documents(self):
            for _ in range(30):
                yield from docs
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prepare(Interrupted(), block_size=16, batch_chars=2000, shard_mb=0.001)
    home = tmp_path / "stoker_home" / "datasets"
    assert not home.exists() or list(home.iterdir()) == []
