"""The Neuron compile cache kept as a prefix of the store, on a real local store and on S3 (moto's server on
loopback).

neuronx-cc is not installed here: the cache folders are written by the test in the layout the Neuron SDK
uses (`neuronxcc-<version>/MODULE_<hash>+<flags>/model.{hlo_module.pb,neff,done,log}`, flock()ed `*.lock`
files while compiling). A compiler killed mid-compilation is a real process holding a real flock that the
test kills with SIGKILL.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from stoker.distributed import neuron_cache as nc
from stoker.errors import StoreError
from stoker.store.blobs import open_store

VER = "neuronxcc-2.14.213.0+013d129b"


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return open_store(tmp_path / "store")
    aws = request.getfixturevalue("aws")
    aws.client("s3").create_bucket(Bucket="stoker-test")
    return open_store("s3://stoker-test/store")


def entry(root: Path, module: str, *files: str, content: bytes = b"") -> Path:
    d = root / VER / module
    d.mkdir(parents=True, exist_ok=True)
    for f in files:
        (d / f).write_bytes(content or f"{module}/{f}".encode() * 100)
    return d


def finished(root: Path, module: str = "MODULE_1+d41d8cd9") -> Path:
    return entry(root, module, "model.hlo_module.pb", "model.neff", "compile_flags.json", "model.done")


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def hold_lock(path: Path) -> subprocess.Popen:
    """A stand-in compiler: flock()s `path` (as neuronx-cc's file locks do) until it is killed."""
    code = ("import fcntl, os, sys, time\n"
            f"fd = os.open({str(path)!r}, os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(120)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "locked"
    return p


def test_upload_keeps_finished_compilations_only(store, tmp_path):
    local = tmp_path / "cache"
    finished(local)
    entry(local, "MODULE_2+d41d8cd9", "model.hlo_module.pb", "model.hlo_module.pb.lock")  # compiling
    entry(local, "MODULE_3+d41d8cd9", "model.hlo_module.pb", "model.log")  # failed, or killed mid-way
    entry(local, "MODULE_4+d41d8cd9", "model.hlo_module.pb", "model.neff", "model.neff.lock")  # neff half written
    (local / VER / "MODULE_5+d41d8cd9.lock").mkdir()
    (local / VER / "MODULE_5+d41d8cd9.lock" / "owner").write_text("pid 1")
    (local / "stray.lock").write_text("")
    report = nc.upload(store, "neuron-cache", local)
    names = store.list("neuron-cache/")
    assert sorted(n.rpartition("@")[0] for n in names) == [
        f"neuron-cache/{VER}/MODULE_1+d41d8cd9/{f}"
        for f in ("compile_flags.json", "model.done", "model.hlo_module.pb", "model.neff")]
    assert report.files == 4 and report.bytes == sum(len(v) for v in tree(local / VER / "MODULE_1+d41d8cd9").values())
    skipped = " ".join(report.skipped)
    for what in ("MODULE_2", "MODULE_3", "MODULE_4", "MODULE_5+d41d8cd9.lock/ (lock)", "stray.lock (lock)"):
        assert what in skipped
    assert "uploaded 4 files" in report.summary()


def test_only_new_or_changed_files_go_up_and_come_down(store, tmp_path):
    local = tmp_path / "cache"
    finished(local)
    assert nc.upload(store, "neuron-cache/", local).files == 4
    again = nc.upload(store, "neuron-cache/", local)
    assert (again.files, again.unchanged) == (0, 4)
    finished(local, "MODULE_9+d41d8cd9")  # a new graph compiled in this run
    (local / VER / "MODULE_1+d41d8cd9" / "compile_flags.json").write_text('{"changed": true}')
    third = nc.upload(store, "neuron-cache/", local)
    assert (third.files, third.unchanged) == (5, 3)

    node = tmp_path / "next-run"
    got = nc.fetch(store, "neuron-cache/", node)
    assert got.files == 8 and tree(node) == tree(local)
    assert nc.fetch(store, "neuron-cache/", node).unchanged == 8  # nothing downloaded twice
    assert (node / VER / "MODULE_1+d41d8cd9" / "model.neff").stat().st_mode & 0o200  # writable, not a blob


def test_a_killed_compilation_never_poisons_the_next_run(tmp_path):
    """The next run's cache folder holds what a killed run left: only finished compilations survive."""
    store = open_store(tmp_path / "store")
    finished(tmp_path / "earlier")
    nc.upload(store, "neuron-cache/", tmp_path / "earlier")

    local = tmp_path / "cache"
    interrupted = entry(local, "MODULE_2+d41d8cd9", "model.hlo_module.pb")
    compiler = hold_lock(interrupted / "model.hlo_module.pb.lock")
    failed = entry(local, "MODULE_3+d41d8cd9", "model.hlo_module.pb", "model.log")
    old_lock_dir = local / VER / "MODULE_6+d41d8cd9.lock"
    old_lock_dir.mkdir()
    os.utime(old_lock_dir, (time.time() - 2 * nc.STALE_LOCK_DIR_S,) * 2)
    new_lock_dir = local / VER / "MODULE_7+d41d8cd9.lock"
    new_lock_dir.mkdir()
    try:
        report = nc.fetch(store, "neuron-cache/", local)  # the compiler is alive: its entry and lock stay
        assert interrupted.is_dir() and (interrupted / "model.hlo_module.pb.lock").exists()
        assert not failed.exists() and not old_lock_dir.exists() and new_lock_dir.is_dir()
        assert f"{VER}/MODULE_3+d41d8cd9/" in report.removed and "removed 2 stale" in report.summary()
    finally:
        compiler.kill()  # SIGKILL: no clean-up of its own; the kernel drops its flock
        compiler.wait()
    assert not nc.lock_is_live(interrupted / "model.hlo_module.pb.lock")
    report = nc.fetch(store, "neuron-cache/", local)
    assert not interrupted.exists() and f"{VER}/MODULE_2+d41d8cd9/" in report.removed
    assert sorted(tree(local)) == sorted(tree(tmp_path / "earlier"))  # finished work only, no lock left


def test_every_node_of_a_gang_uploads_at_once_without_conflict(tmp_path):
    store = open_store(tmp_path / "store")
    nodes = [tmp_path / f"node{i}" for i in range(4)]
    for n in nodes:
        finished(n)  # the same graphs, compiled on every node
    errors: list[BaseException] = []

    def up(n: Path) -> None:
        try:
            nc.upload(store, "neuron-cache/", n)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=up, args=(n,)) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(store.list("neuron-cache/")) == 4
    assert len(nc.remote_index(store, "neuron-cache")) == 4


def test_prefixes_keep_caches_apart_and_bad_ones_name_the_fix(tmp_path):
    store = open_store(tmp_path / "store")
    finished(tmp_path / "a")
    nc.upload(store, "neuron-cache/llama7b-tp8", tmp_path / "a")
    assert nc.fetch(store, "neuron-cache/other", tmp_path / "b").files == 0
    assert nc.fetch(store, "neuron-cache/llama7b-tp8/", tmp_path / "c").files == 4
    for bad in ("", "/", "../x", "blobs/x"):
        with pytest.raises(StoreError):
            nc.normalize_prefix(bad)
    assert nc.upload(store, "neuron-cache/", tmp_path / "missing").files == 0


def test_the_local_folder_is_the_one_neuron_compiles_into():
    assert nc.local_cache_dir({}) == Path("/var/tmp/neuron-compile-cache")
    assert nc.local_cache_dir({"NEURON_COMPILE_CACHE_URL": "/fsx/nc"}) == Path("/fsx/nc")
    flags = "--model-type transformer --cache_dir=/data/cc --distribution-strategy=llm-training"
    assert nc.local_cache_dir({"NEURON_CC_FLAGS": flags, "NEURON_COMPILE_CACHE_URL": "/fsx/nc"}) == Path("/data/cc")
    assert nc.local_cache_dir({"NEURON_CC_FLAGS": "--cache_dir /x/y"}) == Path("/x/y")
    assert nc.local_cache_dir({"NEURON_COMPILE_CACHE_URL": "s3://bucket/cache"}) is None  # Neuron syncs S3 itself
    assert nc.local_cache_dir({"NEURON_CC_FLAGS": "--cache_dir=file:///var/c"}) == Path("/var/c")
