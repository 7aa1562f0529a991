"""Issue 13: an async save blocks training only while the state is staged into host buffers reused from save to
save; the write, the checksums and the commit run in the background, each rank hashing the files it wrote.
Real files, real DCP, real gloo process groups; failures are injected (named in each test)."""

from __future__ import annotations

import datetime
import errno
import json
import os
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from stoker.errors import CheckpointError
from stoker.train import checkpoint as ck
from stoker.train.checkpoint import Checkpointer
from stoker.train.checkpoint_stage import HostStager

torch.set_num_threads(1)


def state(value: float = 1.0, n: int = 1000) -> dict:
    return {"model": {"w": torch.full((n,), value), "b": torch.arange(n, dtype=torch.float32) * value},
            "optim": {"step": torch.tensor(float(value)), "lr": 0.1 * value, "betas": (0.9, 0.99)}}


def loaded(c: Checkpointer, url: str, n: int = 1000) -> dict:
    out = state(0.0, n)
    c.load(url, out)
    return out


def test_staging_reuses_its_buffers_until_shapes_change():
    """DCP's default staging allocated a fresh host copy of the whole state at every save (seconds of page
    faults per GB). The buffers are now allocated once and reused while structure, shapes and dtypes stay;
    plain values are taken from each save's state; a new shape or dtype reallocates."""
    stager = HostStager()
    first = stager.stage(state(1.0))
    ptr = first["model"]["w"].data_ptr()
    second = stager.stage(state(2.0))
    assert stager.allocations == 1 and second["model"]["w"].data_ptr() == ptr
    assert torch.equal(second["model"]["w"], torch.full((1000,), 2.0)) and second["optim"]["lr"] == 0.2
    stager.stage(state(3.0, n=10))
    assert stager.allocations == 2
    changed = state(4.0, n=10)
    changed["model"]["w"] = changed["model"]["w"].double()
    assert torch.equal(stager.stage(changed)["model"]["w"], torch.full((10,), 4.0, dtype=torch.float64))
    assert stager.allocations == 3 and not stager.pinned


def test_async_save_commits_in_the_background(tmp_path: Path, monkeypatch):
    """The commit (every file read back and hashed, manifest, renames, `latest`) used to run on the training
    thread in wait() or the next save(). It now runs in the background thread: the checkpoint gets committed
    without wait(), nothing is hashed on the caller's thread, and the state may change as soon as save()
    returns (it was staged): the checkpoint holds the state as it was at save()."""
    hashed_on: list[bool] = []  # whether on the caller's (main) thread
    real = ck.Store.sha256

    def recording(self, full):
        hashed_on.append(threading.current_thread() is threading.main_thread())
        return real(self, full)

    monkeypatch.setattr(ck.Store, "sha256", recording)
    c = Checkpointer(str(tmp_path), async_save=True, keep=2)
    live = state(1.0)
    for step in (1, 2, 3):
        url = c.save(step, live)
        live["model"]["w"].add_(100.0)  # the next training step changes the state in place at once
        deadline = time.monotonic() + 60
        while (not (tmp_path / "latest").exists() or (tmp_path / "latest").read_text() != f"step_0000000{step}"):
            assert time.monotonic() < deadline, "the async save was never committed without wait()"
            time.sleep(0.02)
        c.wait()
    assert len(hashed_on) == 6 and not any(hashed_on)  # 2 files per checkpoint, none on the caller's thread
    assert c._stager.allocations == 1
    back = loaded(c, url)
    assert torch.equal(back["model"]["w"], torch.full((1000,), 201.0))  # step 3 saw two in-place changes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_00000002", "step_00000003"]


def test_a_failed_background_commit_is_one_error_at_wait(tmp_path: Path, monkeypatch):
    """An injected ENOSPC in the manifest write, now in the background thread: wait() raises the one-line
    CheckpointError naming the checkpoint and the fix, nothing is committed, the partial folder is deleted,
    and the next save works."""
    c = Checkpointer(str(tmp_path), async_save=True)
    c.save(1, state(1.0))
    c.wait()
    real = c.store.write_atomic

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(c.store, "write_atomic", full)
    c.save(2, state(2.0))
    with pytest.raises(CheckpointError, match="no space left.*step_00000002.*checkpoint.dir elsewhere"):
        c.wait()
    monkeypatch.setattr(c.store, "write_atomic", real)
    assert (tmp_path / "latest").read_text() == "step_00000001"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_00000001"]
    c.save(3, state(3.0))
    c.finalize()
    assert torch.equal(loaded(c, str(tmp_path / "step_00000003"))["model"]["w"], torch.full((1000,), 3.0))


# -- two ranks ----------------------------------------------------------------------------------------------
def _worker(rank: int, tmp: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/init", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    hashed: dict[str, list[str]] = {"sync": [], "async": []}
    phase = ["sync"]
    real = ck.Store.sha256

    def recording(self, full):
        hashed[phase[0]].append(os.path.basename(full))
        return real(self, full)

    ck.Store.sha256 = recording  # type: ignore[method-assign]
    out: dict = {}
    try:
        Checkpointer(f"{tmp}/sync").save(1, {"w": torch.full((1000,), float(rank))})
        phase[0] = "async"
        c = Checkpointer(f"{tmp}/async", async_save=True)
        c.save(1, {"w": torch.full((1000,), float(rank))})
        c.wait()
        if rank == 0:  # injected: rank 0's manifest write finds the disk full, in the background thread
            def full(*args, **kwargs):
                raise OSError(errno.ENOSPC, "No space left on device")

            c.store.write_atomic = full  # type: ignore[method-assign]
        c.save(2, {"w": torch.full((1000,), float(rank))})
        start = time.monotonic()
        try:
            c.wait()
            out["error"] = "saved"
        except CheckpointError as e:
            out["error"] = str(e)
        out["s"] = time.monotonic() - start
        out["hashed"] = hashed
    finally:
        ck.Store.sha256 = real  # type: ignore[method-assign]
        Path(f"{tmp}/rank{rank}.json").write_text(json.dumps(out))
        dist.destroy_process_group()


@pytest.mark.slow
def test_each_rank_hashes_what_it_wrote_and_async_failures_reach_every_rank(tmp_path: Path):
    """Rank 0 used to hash every file of a checkpoint alone while the others waited; each rank now hashes the
    shard it wrote (rank 0 also `.metadata`), in the synchronous and the async save alike. A failure of rank 0's
    background commit (ENOSPC injected) is the same CheckpointError on both ranks at wait()."""
    mp.spawn(_worker, args=(str(tmp_path),), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r, res in enumerate(results):
        for phase in ("sync", "async"):
            own = {f"__{r}_0.distcp"} | ({".metadata"} if r == 0 else set())
            assert own <= set(res["hashed"][phase]) and all(
                n in own for n in res["hashed"][phase]), (r, phase, res["hashed"][phase])
    assert results[0]["error"] == results[1]["error"]
    assert "no space left" in results[0]["error"] and "step_00000002" in results[0]["error"]
    assert all(r["s"] < 30 for r in results)
    manifest = json.loads((tmp_path / "sync" / "step_00000001" / "manifest.json").read_text())
    assert sorted(manifest["files"]) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert (tmp_path / "async" / "latest").read_text() == "step_00000001"
