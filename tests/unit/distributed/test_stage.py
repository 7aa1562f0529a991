"""Staging store URLs to a node's disk (stoker.distributed.stage) against moto's S3 server on loopback: verified by
the prefix's manifest, cached across attempts, refused when damaged or empty, and handed to torchrun's command."""

from __future__ import annotations

import hashlib
import json

import pytest

from stoker.distributed.stage import DONE, UnusableDataset, stage
from stoker.distributed.torchrun import TorchrunHelper, _flag_values
from stoker.errors import ConfigError, DataError

pytestmark = pytest.mark.aws


def _put_dataset(s3, bucket: str, prefix: str, files: dict[str, bytes], manifest: bool = True) -> None:
    for name, data in files.items():
        s3.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=data)
    if manifest:
        doc = {"files": [{"path": n, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()}
                         for n, d in files.items()]}
        s3.put_object(Bucket=bucket, Key=f"{prefix}/manifest.json", Body=json.dumps(doc).encode())


FILES = {"data-00000-of-00002.arrow": b"a" * 70_000, "data-00001-of-00002.arrow": b"b" * 1234,
         "dataset_info.json": b"{}", "state.json": b'{"_data_files": []}'}


@pytest.fixture
def s3(aws):
    client = aws.client("s3")
    client.create_bucket(Bucket="data")
    return client


def test_stages_verifies_and_caches(s3, tmp_path):
    _put_dataset(s3, "data", "datasets/wiki", FILES)
    first = stage("s3://data/datasets/wiki/", root=tmp_path)
    assert not first.cached and first.verified and first.files == len(FILES) + 1
    for name, data in FILES.items():
        assert (tmp_path / first.path / name).read_bytes() == data
    assert "verified (sha256)" in first.summary() and "MB in" in first.summary()
    again = stage("s3://data/datasets/wiki", root=tmp_path)  # a retry on the same node: nothing downloaded
    assert again.cached and again.path == first.path and "cached on this node" in again.summary()
    # a changed object is a new copy, never the stale one
    s3.put_object(Bucket="data", Key="datasets/wiki/state.json", Body=b'{"changed": 1}')
    _put_dataset(s3, "data", "datasets/wiki", {**FILES, "state.json": b'{"changed": 1}'})
    changed = stage("s3://data/datasets/wiki", root=tmp_path)
    assert not changed.cached and changed.path != first.path


def test_a_damaged_file_is_refused_and_nothing_is_left(s3, tmp_path):
    _put_dataset(s3, "data", "d", FILES)
    s3.put_object(Bucket="data", Key="d/data-00001-of-00002.arrow", Body=b"c" * 1234)  # same size, other bytes
    with pytest.raises(UnusableDataset, match="d/data-00001-of-00002.arrow does not match the sha256") as e:
        stage("s3://data/d", root=tmp_path)
    assert "downloaded twice" in str(e.value) and "\n" not in str(e.value)
    assert [p.name for p in tmp_path.iterdir()] == []  # no half-staged folder to be mistaken for a copy
    _is_never_retried(e.value)


def test_without_a_manifest_sizes_only_and_said(s3, tmp_path):
    _put_dataset(s3, "data", "raw", FILES, manifest=False)
    got = stage("s3://data/raw", root=tmp_path)
    assert not got.verified and "NOT verified" in got.summary()
    assert (tmp_path / got.path / DONE).is_file()


def test_empty_prefix_and_missing_local_path(s3, tmp_path):
    with pytest.raises(UnusableDataset, match="holds no objects") as e:
        stage("s3://data/nothing-here", root=tmp_path)
    _is_never_retried(e.value)  # issue 34 item 7: an empty prefix is empty on the next attempt too
    with pytest.raises(ConfigError, match="does not exist on this node"):
        stage(str(tmp_path / "missing"), root=tmp_path)
    local = tmp_path / "here"
    local.mkdir()
    assert stage(str(local)).path == str(local)
    assert "used where it is (not copied, not verified)" in stage(f"file://{local}").summary()  # not "verified"


def test_torchrun_command_gets_the_local_path(s3, tmp_path, monkeypatch):
    _put_dataset(s3, "data", "ds", FILES)
    monkeypatch.setenv("STOKER_STAGE_DIR", str(tmp_path / "cache"))
    helper = TorchrunHelper(nnodes=1, node_rank=0, master_addr="127.0.0.1", master_port=29500, nproc_per_node=1)
    args = helper._stage_args({"data_dir": "s3://data/ds", "seq_len": 4096}, ["data_dir"])
    flags = _flag_values(args)
    assert flags["--data_dir"].startswith(str(tmp_path / "cache")) and flags["--seq_len"] == "4096"
    assert helper.staged and helper.staged[0].url == "s3://data/ds"
    as_list = helper._stage_args(["--data_dir=s3://data/ds", "--lr", "3e-4"], {"data_dir": "s3://data/ds"})
    assert _flag_values(as_list)["--data_dir"] == flags["--data_dir"] and "--lr" in as_list
    with pytest.raises(ConfigError, match="has no --data_path to stage"):
        helper._stage_args({"data_dir": "s3://data/ds"}, ["data_path"])


def _is_never_retried(exc: BaseException) -> None:
    """What the task does with it (runtime/member/task.py: exit_code_for, the manifest's `permanent` flag) and what
    the scheduler makes of that (runtime/driver/causes.py `_configured`: a permanent exception is never retried)."""
    from stoker.errors import EXIT_PERMANENT
    from stoker.exitstatus import exit_code_for
    from stoker.runtime.driver.causes import NEVER, classify
    from stoker.store.manifest import exception_record

    assert isinstance(exc, DataError) and exit_code_for(exc) == EXIT_PERMANENT
    found = classify({"exception": exception_record(type(exc).__name__, str(exc), permanent=True)})
    assert found.retry == NEVER and type(exc).__name__ in found.evidence


def test_a_recorded_file_missing_from_the_prefix_is_refused_by_name(s3, tmp_path):
    """Issue 34 item 5: the manifest records a shard the prefix lacks; staging the rest said `verified (sha256)`."""
    _put_dataset(s3, "data", "gone", FILES)
    s3.delete_object(Bucket="data", Key="gone/data-00001-of-00002.arrow")
    with pytest.raises(UnusableDataset, match="lacks data-00001-of-00002.arrow, which its manifest.json records") as e:
        stage("s3://data/gone", root=tmp_path)
    _is_never_retried(e.value)
    assert [p.name for p in tmp_path.iterdir()] == []


def test_files_the_manifest_does_not_record_are_counted_not_called_verified(s3, tmp_path):
    """Issue 34 item 6: a file present but not recorded gets a size check only; the line says so and names it. (It
    is not refused: a README or a tokenizer file beside a dataset is common, and its size is still checked.)"""
    _put_dataset(s3, "data", "extra", FILES)
    s3.put_object(Bucket="data", Key="extra/notes.txt", Body=b"hello")
    got = stage("s3://data/extra", root=tmp_path)
    assert not got.verified and got.checked == len(FILES) and got.unrecorded == ("notes.txt",)
    line = got.summary()
    assert f"{len(FILES)} of {len(FILES) + 1} files verified (sha256)" in line and "sizes only: notes.txt" in line
    assert "all" not in line.split(",")[-1]
    again = stage("s3://data/extra", root=tmp_path)  # the cached copy says the same
    assert again.cached and f"{len(FILES)} of {len(FILES) + 1} files verified" in again.summary()


def test_a_transfer_that_fails_once_is_tried_again_here_not_by_a_new_attempt(tmp_path):
    """A damaged or failed transfer is downloaded once more on the node; only a second mismatch is permanent."""
    from stoker.store.objects import open_objects

    src = tmp_path / "src"
    src.mkdir()
    for name, data in FILES.items():
        (src / name).write_bytes(data)
    doc = {"files": [{"path": n, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in FILES.items()]}
    (src / "manifest.json").write_text(json.dumps(doc))
    store = open_objects(str(src), error=DataError)
    real, calls = store.get_many, []

    def flaky(files):
        calls.append(1)
        if len(calls) == 1:
            raise DataError("the connection was reset")
        return real(files)

    store.get_many = flaky  # (an injected store: stage() takes one)
    got = stage("memory://flaky/ds", root=tmp_path / "stage", store=store)
    assert got.verified and (tmp_path / "stage" / got.path / "state.json").read_bytes() == FILES["state.json"]
