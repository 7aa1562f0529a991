"""Every source kind yields the same documents in order; bad input names the file and the fix."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from stoker.data import DataError, resolve_source
from stoker.data.sources import shakespeare_files


def test_shakespeare_builtin():
    files = shakespeare_files()
    assert len(files) == 77 and all(f.suffix == ".txt" and f.name != "metadata.txt" for f in files)
    src = resolve_source("shakespeare")
    first = next(iter(src.documents()))
    assert len(first) > 50_000 and first.startswith("All's Well, that Ends Well")


def test_jsonl_gz_zst_and_folder_agree(tmp_path, docs, jsonl_file, gz_jsonl, text_folder):
    zst = tmp_path / "c.jsonl.zst"
    zst.write_bytes(zstandard.ZstdCompressor().compress(jsonl_file.read_bytes()))
    txt_zst = tmp_path / "one.txt.zst"
    txt_zst.write_bytes(zstandard.ZstdCompressor().compress(docs[0].encode()))
    for spec in (jsonl_file, gz_jsonl, zst, text_folder, str(text_folder / "doc*.txt")):
        assert list(resolve_source(str(spec)).documents()) == docs, spec
    assert list(resolve_source(str(txt_zst)).documents()) == [docs[0]]


def test_text_doc_split_modes(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("first line\nsecond line\n\nthird para\n\n\n", encoding="utf-8")
    assert len(list(resolve_source(str(path)).documents())) == 1
    assert list(resolve_source(str(path), doc_split="paragraph").documents()) == ["first line\nsecond line",
                                                                                 "third para"]
    assert list(resolve_source(str(path), doc_split="line").documents()) == ["first line", "second line",
                                                                            "third para"]


def test_parquet_and_text_field(tmp_path, docs):
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"body": docs, "n": list(range(len(docs)))}), path)
    assert list(resolve_source(str(path), text_field="body").documents()) == docs
    with pytest.raises(DataError, match=r"c\.parquet.*no text column 'text'.*body.*--text-field"):
        list(resolve_source(str(path)).documents())


def test_unknown_jsonl_field_names_file_and_line(jsonl_file):
    with pytest.raises(DataError, match=r"corpus\.jsonl:1: no text field 'content'.*\['id', 'text'\]"):
        list(resolve_source(str(jsonl_file), text_field="content").documents())


def test_bad_json_line(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"text": "ok"}\n{broken\n')
    with pytest.raises(DataError, match=r"x\.jsonl:2: not valid JSON"):
        list(resolve_source(str(path)).documents())


def test_undecodable_bytes(tmp_path):
    path = tmp_path / "latin.txt"
    path.write_bytes("caf\u00e9 cr\u00e8me".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin\.txt: bytes 3-4 are not valid utf-8.*iconv.*errors='replace'"):
        list(resolve_source(str(path)).documents())
    assert list(resolve_source(str(path), encoding="latin-1").documents()) == ["caf\u00e9 cr\u00e8me"]
    assert "\ufffd" in next(iter(resolve_source(str(path), errors="replace").documents()))


def test_missing_and_unsupported(tmp_path):
    with pytest.raises(DataError, match="matches no files"):
        resolve_source(str(tmp_path / "nothing*.txt"))
    (tmp_path / "a.csv").write_text("x")
    with pytest.raises(DataError, match="unsupported file type"):
        resolve_source(str(tmp_path / "a.csv"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="holds no .txt"):
        resolve_source(str(empty))


def test_hf_datasets_local_folder(tmp_path, docs):
    folder = tmp_path / "hfdata"
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    src = resolve_source(f"hf:{folder}")  # the real datasets.load_dataset on a local data folder
    assert src.total_docs == len(docs) and list(src.documents()) == docs
    assert src.describe()["split"] == "train"
    with pytest.raises(DataError, match="could not load"):
        resolve_source(f"hf:{folder}::nosuchsplit")


def test_save_to_disk_folders(tmp_path, docs):
    import datasets

    ds = datasets.Dataset.from_dict({"text": docs})
    ds.save_to_disk(str(tmp_path / "single"))
    datasets.DatasetDict({"train": ds, "validation": ds.select(range(2))}).save_to_disk(str(tmp_path / "dd"))
    assert list(resolve_source(str(tmp_path / "single")).documents()) == docs
    assert list(resolve_source(str(tmp_path / "dd")).documents()) == docs
    assert list(resolve_source(str(tmp_path / "dd"), split="validation").documents()) == docs[:2]
    with pytest.raises(DataError, match="no text column 'body'"):
        resolve_source(str(tmp_path / "single"), text_field="body")


def test_fingerprint_changes_with_content(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("one")
    fp1 = resolve_source(str(path)).fingerprint()
    assert resolve_source(str(path)).fingerprint() == fp1
    path.write_text("one two")
    assert resolve_source(str(path)).fingerprint() != fp1


def test_folder_inside_a_dot_folder(tmp_path, docs):
    """A corpus under ~/.cache/... is read; dot-files and dot-folders below the named folder are not."""
    folder = tmp_path / ".cache" / "corpus"
    (folder / ".git").mkdir(parents=True)
    (folder / "a.txt").write_text(docs[0])
    (folder / ".hidden.txt").write_text("skipped")
    (folder / ".git" / "b.txt").write_text("skipped")
    assert list(resolve_source(str(folder)).documents()) == [docs[0]]
