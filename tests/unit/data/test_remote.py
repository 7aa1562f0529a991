"""Corpora in an object store: a real S3 API server (moto) on loopback, and fsspec's memory filesystem."""

from __future__ import annotations

import gzip
import json

import fsspec
import numpy as np
import pytest

from stoker.data import DataError, open_dataset, prepare
from stoker.data.remote import glob_match
from stoker.data.sources import resolve_source

pytestmark = pytest.mark.aws


def tokens(ref) -> np.ndarray:
    ds = open_dataset(ref)
    return np.concatenate([ds[i] for i in range(len(ds))])


@pytest.fixture()
def corpus(s3, tmp_path, docs):
    """The same files locally (tmp_path/raw) and under s3://data/raw/, plus files prepare must skip."""
    local = tmp_path / "raw"
    (local / "more").mkdir(parents=True)
    files = {"a.jsonl.gz": gzip.compress("".join(json.dumps({"text": d}) + "\n" for d in docs[:6]).encode()),
             "b.txt": docs[6].encode(), "more/c.jsonl": "".join(json.dumps({"text": d}) + "\n"
                                                               for d in docs[7:]).encode()}
    for name, data in files.items():
        (local / name).write_bytes(data)
        s3.put_object(Bucket="data", Key=f"raw/{name}", Body=data)
    s3.put_object(Bucket="data", Key="raw/notes.bin", Body=b"\x00\x01")  # not a corpus file: skipped
    s3.put_object(Bucket="data", Key="raw-other/x.txt", Body=b"not under raw/")  # same prefix, other folder
    return local


def test_prefix_equals_the_local_folder(tmp_path, corpus):
    ref = prepare("s3://data/raw/", block_size=32, val_fraction=0, output=str(tmp_path / "remote"))
    local = prepare(str(corpus), block_size=32, val_fraction=0, output=str(tmp_path / "local"))
    assert np.array_equal(tokens(ref), tokens(local))
    src = ref.manifest["source"]
    assert src["kind"] == "remote-files" and src["num_files"] == 3 and src["spec"] == "s3://data/raw/"


def test_glob_and_single_object(tmp_path, corpus, docs):
    src = resolve_source("s3://data/raw/**/*.jsonl*")
    assert [str(p) for p in src.files] == ["data/raw/a.jsonl.gz", "data/raw/more/c.jsonl"]
    assert list(src.documents()) == docs[:6] + docs[7:]
    assert [str(p) for p in resolve_source("s3://data/raw/*.jsonl*").files] == ["data/raw/a.jsonl.gz"]
    one = resolve_source("s3://data/raw/b.txt")
    assert list(one.documents()) == [docs[6]]


def test_changed_object_is_a_new_dataset(tmp_path, corpus, s3):
    first = prepare("s3://data/raw/", block_size=32, val_fraction=0)
    assert prepare("s3://data/raw/", block_size=32, val_fraction=0).fingerprint == first.fingerprint
    s3.put_object(Bucket="data", Key="raw/b.txt", Body=b"A different play entirely. " * 40)
    assert prepare("s3://data/raw/", block_size=32, val_fraction=0).fingerprint != first.fingerprint


def test_bad_remote_input_names_the_url(tmp_path, s3):
    with pytest.raises(DataError, match="s3://data/nothing/' matches no objects"):
        resolve_source("s3://data/nothing/")
    s3.put_object(Bucket="data", Key="bad/x.jsonl", Body=b'{"text": "fine"}\n{broken\n')
    with pytest.raises(DataError, match=r"s3://data/bad/x\.jsonl:2: not valid JSON"):
        prepare("s3://data/bad/x.jsonl", block_size=4, val_fraction=0, output=str(tmp_path / "o"))
    assert not (tmp_path / "o").exists()
    with pytest.raises(DataError, match="s3://missing-bucket/raw.*listing failed.*bucket exists"):
        resolve_source("s3://missing-bucket/raw/")


def test_fsspec_memory_filesystem(tmp_path, docs):
    fs = fsspec.filesystem("memory")
    for i, d in enumerate(docs[:4]):
        fs.pipe(f"/corpus/part-{i}.txt", d.encode())
    try:
        src = resolve_source("memory://corpus/part-*.txt")
        assert list(src.documents()) == docs[:4]
    finally:
        fs.rm("/corpus", recursive=True)


@pytest.mark.parametrize(("pattern", "path", "hit"), [
    ("b/raw/*.txt", "b/raw/a.txt", True), ("b/raw/*.txt", "b/raw/x/a.txt", False),
    ("b/raw/**/*.txt", "b/raw/a.txt", True), ("b/raw/**/*.txt", "b/raw/x/y/a.txt", True),
    ("b/raw/part-?.txt", "b/raw/part-1.txt", True), ("b/raw/[ab].txt", "b/raw/c.txt", False),
    ("b/raw/*.txt", "b/raw/a.txt.gz", False), ("b/raw/*.txt", "b/raw/.hidden.txt", False),
    ("b/raw/**/*.txt", "b/raw/.git/a.txt", False), ("b/raw/.*.txt", "b/raw/.hidden.txt", True),
    ("b/raw/a[!x]b.txt", "b/raw/a!b.txt", True), ("b/raw/a[!x]b.txt", "b/raw/axb.txt", False),
    ("b/raw/a[x!]b.txt", "b/raw/a!b.txt", True), ("b/raw/a[]]b.txt", "b/raw/a]b.txt", True),
    ("b/raw/a[!]b.txt", "b/raw/a[!]b.txt", True),
])
def test_glob_semantics(pattern, path, hit):
    assert glob_match(pattern, path) is hit


def test_dot_folders_in_the_named_prefix_and_literal_brackets(tmp_path, s3, docs):
    s3.put_object(Bucket="data", Key=".staging/raw/a.txt", Body=docs[0].encode())
    s3.put_object(Bucket="data", Key=".staging/raw/.cache/b.txt", Body=b"skipped: a dot-folder below the prefix")
    s3.put_object(Bucket="data", Key="odd/file[1].txt", Body=docs[1].encode())
    assert list(resolve_source("s3://data/.staging/raw/").documents()) == [docs[0]]
    assert list(resolve_source("s3://data/odd/file[1].txt").documents()) == [docs[1]]


def test_stopping_early_cleans_up(s3, docs):
    for i in range(3):
        s3.put_object(Bucket="data", Key=f"many/{i}.txt", Body=docs[i].encode())
    gen = resolve_source("s3://data/many/").documents()
    assert next(gen) == docs[0]
    gen.close()  # the temporary folder and the pending download go away
