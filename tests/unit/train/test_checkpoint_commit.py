"""Issue 13: checkpoint commit safety (attempt-scoped temp folders, rename aside), rank 0's I/O failures seen by
every rank at once, and verification shared among ranks on resume. Real files, real gloo process groups."""

from __future__ import annotations

import datetime
import errno
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from stoker.errors import CheckpointError
from stoker.train import checkpoint as ck
from stoker.train.checkpoint import Checkpointer, resolve_resume

torch.set_num_threads(1)


def state(value: float = 1.0, n: int = 1000) -> dict:
    return {"w": torch.full((n,), value), "b": torch.arange(n, dtype=torch.float32) * value}


def test_a_fresh_temp_folder_of_another_attempt_survives_a_stale_one_does_not(tmp_path: Path):
    """A zombie gang's live `.tmp-*` folder used to be deleted by any new Checkpointer on the same folder."""
    live = tmp_path / ".tmp-step_00000003-otherattempt"
    stale = tmp_path / ".tmp-step_00000002-deadattempt"
    for d in (live, stale):
        d.mkdir()
        (d / "__0_0.distcp").write_bytes(b"x")
    old = time.time() - 7 * 3600
    for p in (stale / "__0_0.distcp", stale):
        os.utime(p, (old, old))
    c = Checkpointer(str(tmp_path))
    assert live.exists() and not stale.exists()
    c.save(1, state())
    assert live.exists() and (tmp_path / "latest").read_text() == "step_00000001"
    assert not any(p.name.startswith((".tmp-", ".old-")) for p in tmp_path.iterdir() if p != live)


def test_a_failed_resave_keeps_the_committed_checkpoint(tmp_path: Path, monkeypatch):
    """Re-saving a step used to delete `step_N` before moving the new one into place: a failure (injected here
    into the rename into place) left `latest` naming nothing. Now the old one is renamed aside and back."""
    c = Checkpointer(str(tmp_path))
    c.save(4, state(1.0))
    real_rename = os.rename

    def failing(src, dst):
        if ".tmp-" in str(src) and os.path.basename(dst) == "step_00000004":
            raise OSError(errno.EIO, "injected I/O error")
        return real_rename(src, dst)

    monkeypatch.setattr(ck.os, "rename", failing)
    with pytest.raises(CheckpointError, match="step_00000004.*injected"):
        c.save(4, state(2.0))
    monkeypatch.undo()
    assert c.verify("step_00000004")["step"] == 4
    loaded = state(0.0)
    c.load(str(tmp_path / "step_00000004"), loaded)
    assert torch.equal(loaded["w"], state(1.0)["w"])
    c.save(4, state(2.0))  # a working re-save replaces it, and leaves no aside folder
    c.load(str(tmp_path / "step_00000004"), loaded)
    assert torch.equal(loaded["w"], state(2.0)["w"])
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".tmp-step_00000004")) == [
        "latest", "step_00000004"]


def test_a_commit_interrupted_between_its_renames_is_restored(tmp_path: Path):
    """A crash after `step_N` was renamed aside and before the new one took its place: the next Checkpointer
    puts the aside checkpoint back, so `latest` never names a missing checkpoint."""
    c = Checkpointer(str(tmp_path))
    c.save(2, state())
    os.rename(tmp_path / "step_00000002", tmp_path / ".old-step_00000002-crashedattempt")
    c2 = Checkpointer(str(tmp_path))
    assert c2.latest() == "step_00000002"


def test_latest_with_a_non_utf8_pointer_falls_back(tmp_path: Path, caplog):
    c = Checkpointer(str(tmp_path))
    c.save(1, state())
    (tmp_path / "latest").write_bytes(b"step_\xff0000001")
    assert c.latest() == "step_00000001"
    assert "ignoring" in caplog.text and "latest" in caplog.text


# -- rank 0 failing during a save: every rank raises at once --------------------------------------------------
def _init(rank: int, tmp: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp}/init", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))


def _enospc_worker(rank: int, tmp: str) -> None:
    torch.set_num_threads(1)
    _init(rank, tmp)
    try:
        c = Checkpointer(f"{tmp}/ck")
        if rank == 0:  # injected: rank 0's manifest write finds the disk full
            def full(*args, **kwargs):
                raise OSError(errno.ENOSPC, "No space left on device")

            c.store.write_atomic = full  # type: ignore[method-assign]
        start = time.monotonic()
        try:
            c.save(1, state(float(rank)))
            outcome = "saved"
        except CheckpointError as e:
            outcome = str(e)
        Path(f"{tmp}/rank{rank}.json").write_text(json.dumps({"error": outcome, "s": time.monotonic() - start}))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_rank0_disk_full_during_commit_fails_every_rank_at_once(tmp_path: Path):
    """Rank 0 commits alone while rank 1 waits in a collective. An ENOSPC (injected into rank 0's manifest write)
    used to leave rank 1 waiting until the collective timeout (30 min on NCCL); both now raise the same one-line
    error naming the checkpoint and the fix, well within the group's 60 s timeout."""
    mp.spawn(_enospc_worker, args=(str(tmp_path),), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert results[0]["error"] == results[1]["error"]
    assert "no space left" in results[0]["error"] and "step_00000001" in results[0]["error"]
    assert "point checkpoint.dir elsewhere" in results[0]["error"] and "\n" not in results[0]["error"]
    assert all(r["s"] < 20 for r in results)
    assert not (tmp_path / "ck" / "latest").exists()


def test_a_real_full_disk_is_one_checkpoint_error(tmp_path: Path):
    """A 1 MiB tmpfs (a real full disk): the save fails with one CheckpointError saying what to do, and
    nothing is committed."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {r.stderr.strip()}")
    try:
        c = Checkpointer(str(mnt / "ck"))
        c.save(1, state(n=1000))
        with pytest.raises(CheckpointError, match="no space left.*step_00000002.*checkpoint.dir elsewhere"):
            c.save(2, state(n=1_000_000))  # 8 MB
        assert (mnt / "ck" / "latest").read_text() == "step_00000001" and c.latest() == "step_00000001"
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


# -- verification shared among ranks ------------------------------------------------------------------------
def _verify_worker(rank: int, tmp: str, corrupt: bool) -> None:
    torch.set_num_threads(1)
    _init(rank, tmp)
    hashed: list[str] = []
    real = ck.Store.sha256

    def counting(self, full):
        hashed.append(os.path.basename(full))
        return real(self, full)

    try:
        c = Checkpointer(f"{tmp}/ck")
        c.save(3, state(float(rank + 1)))
        dist.barrier()
        ck.Store.sha256 = counting  # type: ignore[method-assign]
        if corrupt:
            files = sorted(json.loads(Path(f"{tmp}/ck/step_00000003/manifest.json").read_text())["files"])
            victim = Path(f"{tmp}/ck/step_00000003") / files[1]  # file 1: rank 1's share
            if rank == 0:
                data = bytearray(victim.read_bytes())
                data[len(data) // 2] ^= 0x01
                victim.write_bytes(bytes(data))
            dist.barrier()
        try:
            if corrupt:
                c.inspect(f"{tmp}/ck/step_00000003")
                outcome: dict = {"url": "loaded"}
            else:
                url = resolve_resume(c, "", "auto")
                outcome = {"url": url, "manifest_step": c.inspect(url)["step"]}
        except CheckpointError as e:
            outcome = {"error": str(e)}
        outcome["hashed"] = hashed
        Path(f"{tmp}/rank{rank}.json").write_text(json.dumps(outcome))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("corrupt", [False, True])
def test_resume_verification_is_split_among_ranks(tmp_path: Path, corrupt: bool):
    """Rank 0 used to hash every file of the checkpoint alone (twice: in latest() and in inspect()) while the
    others waited. Each rank now hashes its share once; a file corrupted in rank 1's share (one flipped byte)
    is reported by both ranks in the same words."""
    mp.spawn(_verify_worker, args=(str(tmp_path), corrupt), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    files = sorted(json.loads((tmp_path / "ck" / "step_00000003" / "manifest.json").read_text())["files"])
    if not corrupt:
        assert len(files) >= 3
        for r, res in enumerate(results):
            assert res["url"].endswith("step_00000003") and res["manifest_step"] == 3
            assert sorted(res["hashed"]) == sorted(os.path.basename(f) for f in files[r::2])
    else:
        assert results[0]["error"] == results[1]["error"]
        assert "does not match its checksum" in results[0]["error"] and files[1] in results[0]["error"]
        assert sorted(results[0]["hashed"]) == sorted(os.path.basename(f) for f in files[0::2])
