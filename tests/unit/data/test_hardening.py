"""Issue 13: a bad --encoding fails up front, hostile dataset manifests cannot name files outside the
dataset, long documents are cut between words, and skipped empty documents are counted."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stoker.cli.data import main
from stoker.data import DataError, load_tokenizer, open_dataset, prepare
from stoker.data.layout import MANIFEST


# -- 1. --encoding is checked before anything happens ------------------------------------------------------
@pytest.mark.parametrize("encoding", ["no-such-encoding", "base64"])  # base64: a codec, but not a text one
def test_unknown_encoding_is_one_error_line_and_creates_nothing(tmp_path, jsonl_file, encoding):
    env = {**os.environ, "STOKER_HOME": str(tmp_path / "home")}
    bad = subprocess.run([sys.executable, "-m", "stoker.data", "prepare", str(jsonl_file), "-q",
                          "--encoding", encoding], capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 1, bad.stderr
    assert "Traceback" not in bad.stderr
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: encoding={encoding!r} (--encoding)")
    assert "utf-8" in lines[0] and "latin-1" in lines[0]  # the fix: a codec name that works
    assert not (tmp_path / "home").exists()  # no dataset folder, no staging folder


def test_unknown_encoding_through_the_api_and_the_stoker_cli(tmp_path, jsonl_file, capsys):
    with pytest.raises(DataError, match="--encoding"):
        prepare(str(jsonl_file), encoding="no-such-encoding", output=str(tmp_path / "d"))
    assert main(["prepare", str(jsonl_file), "-o", str(tmp_path / "d"), "--encoding", "nope"]) == 1
    assert "error: encoding='nope' (--encoding)" in capsys.readouterr().err
    assert not (tmp_path / "d").exists() and not list(tmp_path.glob(".d.tmp-*"))


# -- 2. manifests from a store may not name paths outside the dataset ------------------------------------
def _tamper(folder: Path, path: str) -> None:
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["splits"]["train"]["shards"][0]["path"] = path
    (folder / MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("bad", ["../outside/shard.bin", "ABS", "train//shard-00000.bin",
                                 "train\\..\\..\\outside\\shard.bin", "./train/shard-00000.bin", ""])
def test_local_manifest_with_unsafe_shard_path_is_refused(tmp_path, jsonl_file, bad):
    """The shard the path points at is a real, valid copy of the dataset's shard (same size and sha256),
    so without the check the dataset would open and read a file outside its folder."""
    ref = prepare(str(jsonl_file), block_size=32, val_fraction=0, output=str(tmp_path / "ds"))
    (tmp_path / "outside").mkdir()
    shutil.copy(ref.path / "train" / "shard-00000.bin", tmp_path / "outside" / "shard.bin")
    bad = str(tmp_path / "outside" / "shard.bin") if bad == "ABS" else bad
    _tamper(tmp_path / "ds", bad)
    with pytest.raises(DataError) as err:
        open_dataset(tmp_path / "ds")
    assert str(tmp_path / "ds" / MANIFEST) in str(err.value) and repr(bad) in str(err.value)
    assert "refusing" in str(err.value)


def test_hostile_fingerprint_is_refused(tmp_path, jsonl_file):
    """The fingerprint names the local cache folder of a remote dataset: it must be a plain name."""
    prepare(str(jsonl_file), block_size=32, val_fraction=0, output=str(tmp_path / "ds"))
    manifest = json.loads((tmp_path / "ds" / MANIFEST).read_text())
    manifest["fingerprint"] = "../../../evil"
    (tmp_path / "ds" / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(DataError, match=r"refusing fingerprint='\.\./\.\./\.\./evil'"):
        open_dataset(tmp_path / "ds")


@pytest.mark.aws
@pytest.mark.parametrize("bad", ["../../evil", "ABS", "/etc/passwd"])
def test_s3_manifest_with_traversal_writes_nothing_outside(tmp_path, jsonl_file, aws, bad):
    """A manifest in a shared bucket (real S3 API on loopback) names shards outside the dataset folder; the
    objects those names point at exist, so an unchecked download would write them. Nothing may be written:
    not next to the cache folder, not at an absolute path."""
    ref = prepare(str(jsonl_file), block_size=32, val_fraction=0, output=str(tmp_path / "ds"))
    s3 = aws.client("s3")
    s3.create_bucket(Bucket="data")
    evil_abs = tmp_path / "abs-evil"  # an absolute path that is safe to (not) write in a test
    bad = str(evil_abs) if bad == "ABS" else bad
    manifest = json.loads((ref.path / MANIFEST).read_text())
    manifest["splits"]["train"]["shards"][0]["path"] = bad
    shard = (ref.path / "train" / "shard-00000.bin").read_bytes()
    if bad != "/etc/passwd":  # never offer a regressed download something to write over a system file
        for key in (f"ds/{bad}", f"ds/{bad.lstrip('/')}", "evil"):  # wherever a download might fetch from
            s3.put_object(Bucket="data", Key=key, Body=shard)
    s3.put_object(Bucket="data", Key=f"ds/{MANIFEST}", Body=json.dumps(manifest).encode())
    before = {p for p in tmp_path.rglob("*")}
    with pytest.raises(DataError) as err:
        open_dataset("s3://data/ds")
    assert f"s3://data/ds/{MANIFEST}" in str(err.value) and repr(bad) in str(err.value)
    assert {p for p in tmp_path.rglob("*")} == before  # no download, no cache folder, no temp folder
    assert not evil_abs.exists()


def test_download_checks_the_manifest_it_is_given(tmp_path):
    from stoker.data import layout

    manifest = {"format": layout.FORMAT, "fingerprint": "abc", "splits": {"train": {"shards": [
        {"path": "../../evil", "bytes": 1, "num_blocks": 1, "sha256": "0" * 64}]}}}
    with pytest.raises(DataError, match=r"refusing .*'\.\./\.\./evil'"):
        layout.download("memory://x/ds", manifest, tmp_path / "dest")
    assert list(tmp_path.iterdir()) == []


# -- 3. long documents are cut between words -----------------------------------------------------------------
def _words_text(n_chars: int, seed: int = 0) -> str:
    """Random lowercase words separated by one space, sometimes two spaces or a tab, no line break; the
    1,000,000th and 2,000,000th characters fall inside words (the old cut split a word there)."""
    rng = random.Random(seed)
    parts, size = [], 0
    while size < n_chars:
        word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 12)))
        sep = rng.choice([" "] * 20 + ["  ", "\t", " \t "])
        parts.append(word + sep)
        size += len(word) + len(sep)
    text = "".join(parts)[:n_chars].rstrip() + " end"
    # one-token words across both limits: " hel|lo", " wor|ld" (a cut there gives other ids)
    chars = list(text)
    for limit, word in ((1_000_000, " hello "), (2_000_000, " world ")):
        chars[limit - 4:limit + 3] = word
    return "".join(chars)


def test_long_document_without_line_breaks_encodes_like_the_tokenizer(tmp_path):
    """A 2.5M-character document of words, no line break: it is encoded in pieces (GPT-2 cannot spread one
    text over the cores), and the ids equal the tokenizer's on the whole text."""
    text = _words_text(2_500_000)
    assert "\n" not in text and len(text) > 2_000_000
    assert text[999_996:1_000_000] + "|" + text[1_000_000:1_000_003] == " hel|lo "
    tok = load_tokenizer("gpt2")
    assert tok.encode(" hello") != tok.encode(" hel") + tok.encode("lo")
    path = tmp_path / "long.txt"
    path.write_text(text)
    assert not tok.splits_long_texts
    ref = prepare(str(path), tokenizer="gpt2", block_size=64, val_fraction=0, remainder="pad",
                  output=str(tmp_path / "o"))
    ds = open_dataset(ref, verify="full")
    got = np.concatenate([ds[i] for i in range(len(ds))]).tolist()
    want = [tok.bos_id, *tok.encode(text)]  # GPT-2: one <|endoftext|> before each document
    assert got[:len(want)] == want
    assert all(t == tok.eos_id for t in got[len(want):])  # only the padding of the last block follows
    assert ref.manifest["splits"]["train"]["num_documents"] == 1


def test_pieces_cut_before_a_word_and_at_the_limit_without_whitespace():
    from stoker.data.prepare import _pieces

    text = "aaaa bbbb   cccc\tdddd"
    pieces = _pieces(text, 8)
    assert "".join(pieces) == text and all(len(p) <= 8 for p in pieces)
    assert pieces == ["aaaa", " bbbb  ", " cccc", "\tdddd"]  # each cut is before the space opening a word
    assert _pieces("x" * 25, 10) == ["x" * 10, "x" * 10, "x" * 5]  # no whitespace: at the limit


# -- 4. empty documents are skipped and counted --------------------------------------------------------------
def test_empty_and_whitespace_documents_are_skipped_and_counted(tmp_path, docs):
    path = tmp_path / "c.jsonl"
    texts = [docs[0], "", " \n\t ", docs[1], "\u3000", docs[2]]
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tok = load_tokenizer("llama")
    ref = prepare(str(path), block_size=16, val_fraction=0, remainder="pad", output=str(tmp_path / "o"))
    st = ref.manifest["stats"]
    assert st["documents_skipped_empty"] == 3 and st["documents"] == 3
    assert ref.manifest["splits"]["train"]["num_documents"] == 3
    got = open_dataset(ref)
    stream = np.concatenate([got[i] for i in range(len(got))]).tolist()
    want = [x for d in docs[:3] for x in (tok.bos_id, *tok.encode(d), tok.eos_id)]
    assert stream[:len(want)] == want  # no BOS/EOS pair for the skipped ones


def test_corpus_of_only_empty_documents_says_so(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["", "  ", "\n"]))
    with pytest.raises(DataError, match=r"no documents \(empty corpus, only 3 empty or whitespace-only ones\)"):
        prepare(str(path), output=str(tmp_path / "o"))
