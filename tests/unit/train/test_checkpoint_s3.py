"""Checkpoints straight to S3 (moto's server on loopback, reached through STOKER_S3_ENDPOINT_URL): two gloo
ranks each write their own shards (multipart, in parallel), the manifest commits; one process resumes them
(another data-parallel count) bitwise equal to the same checkpoint on local disk; a corrupted shard is refused."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from stoker.errors import CheckpointError
from stoker.train.checkpoint import Checkpointer

pytestmark = pytest.mark.aws

BUCKET, URL = "ckpt", "s3://ckpt/run/ck"
ROWS, COLS = 3072, 1024  # w and exp_avg: 12 MB each; a rank's shard (12 MB) goes up in three 5 MiB parts


def full_state(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return {"w": torch.randn(ROWS, COLS, generator=g), "b": torch.randn(COLS, generator=g),
            "exp_avg": torch.randn(ROWS, COLS, generator=g)}


def _worker(rank: int, tmp: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/init", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    try:
        mesh = init_device_mesh("cpu", (2,))
        out = {}
        for step in (1, 2):
            state = {"model": {k: distribute_tensor(v, mesh, [Replicate() if k == "b" else Shard(0)])
                               for k, v in full_state(step).items()}}
            Checkpointer(f"{tmp}/local").save(step, state)
            c = Checkpointer(URL, async_save=step == 2)  # the async path stages, then uploads in the background
            out[step] = c.save(step, state)
            c.finalize()
        Path(f"{tmp}/rank{rank}.json").write_text(json.dumps(out))
    finally:
        dist.destroy_process_group()


def damage_the_newest(s3, bucket: str, shard: str, url: str) -> None:
    """A shard of step 2 damaged in the bucket (same size, other bytes) is refused when read, never loaded as
    weights; truncated, the cheap size check of latest() skips step 2 and the previous checkpoint resumes."""
    body = bytearray(s3.get_object(Bucket=bucket, Key=shard)["Body"].read())
    body[len(body) // 2] ^= 0xFF
    s3.put_object(Bucket=bucket, Key=shard, Body=bytes(body))
    name = shard.rsplit("/", 1)[1].replace(".", r"\.")
    with pytest.raises(CheckpointError, match=rf"{name} does not match its checksum.*use an earlier one"):
        Checkpointer(url).load(f"{url}/step_00000002", _empty())
    s3.put_object(Bucket=bucket, Key=shard, Body=bytes(body[:-10]))
    short = rf"{name} has {len(body) - 10} bytes, its manifest(\.json)? says {len(body)}: the checkpoint is truncated"
    with pytest.raises(CheckpointError, match=short + " or corrupted; use an earlier one"):
        Checkpointer(url).load(f"{url}/step_00000002", _empty())
    assert Checkpointer(url).latest() == "step_00000001"


def _empty() -> dict:
    return {"model": {k: torch.empty_like(v) for k, v in full_state(0).items()}}


@pytest.mark.slow
def test_two_ranks_save_to_s3_and_one_resumes_bitwise(tmp_path: Path, aws, monkeypatch):
    s3 = aws.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    monkeypatch.setenv("STOKER_S3_PART_SIZE", "5MiB")
    mp.spawn(_worker, args=(str(tmp_path),), nprocs=2, join=True)
    assert json.loads((tmp_path / "rank1.json").read_text())["2"] == f"{URL}/step_00000002"
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"])
    assert [k for k in keys if "step_00000002" in k] == [
        "run/ck/step_00000002/.metadata", "run/ck/step_00000002/__0_0.distcp", "run/ck/step_00000002/__1_0.distcp",
        "run/ck/step_00000002/manifest.json"]
    assert "run/ck/latest" in keys and not any(".tmp" in k for k in keys)  # committed in place, nothing renamed
    head = s3.head_object(Bucket=BUCKET, Key="run/ck/step_00000002/__1_0.distcp")
    assert head["ETag"].strip('"').endswith("-3")  # a multipart upload: 3 parts, sent in parallel
    assert not s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads")

    remote, local = Checkpointer(URL), Checkpointer(str(tmp_path / "local"))  # one process: DP=1
    assert remote.latest() == local.latest() == "step_00000002"
    got_s3, got_local = _empty(), _empty()
    remote.load(f"{URL}/step_00000002", got_s3)
    local.load(str(tmp_path / "local" / "step_00000002"), got_local)
    want = full_state(2)
    for k in want:
        assert torch.equal(got_s3["model"][k], got_local["model"][k]) and torch.equal(got_s3["model"][k], want[k])

    damage_the_newest(s3, BUCKET, "run/ck/step_00000002/__1_0.distcp", URL)
    fresh = Checkpointer(URL)
    older = _empty()
    fresh.load(f"{URL}/step_00000001", older)
    assert all(torch.equal(older["model"][k], v) for k, v in full_state(1).items())


def test_a_second_s3_server_saves_resumes_and_refuses_damage(rclone_s3, monkeypatch):
    """The same commit and checks against another S3 implementation than moto (rclone's `serve s3`, in Go):
    a synchronous and an async save (multipart, 5 MiB parts), a bitwise resume, a damaged shard refused when
    read, a truncated one skipped by latest()."""
    import os

    import boto3

    monkeypatch.setenv("STOKER_S3_PART_SIZE", "5MiB")
    url = f"s3://{rclone_s3}/run/ck"
    for step in (1, 2):
        c = Checkpointer(url, async_save=step == 2)
        assert c.save(step, {"model": full_state(step)}) == f"{url}/step_{step:08d}"
        c.finalize()
    ck = Checkpointer(url)
    assert ck.latest() == "step_00000002"
    got = _empty()
    ck.load(f"{url}/step_00000002", got)
    assert all(torch.equal(got["model"][k], v) for k, v in full_state(2).items())

    s3 = boto3.session.Session(aws_access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
                               aws_secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
                               region_name="us-east-1").client("s3", endpoint_url=os.environ["STOKER_S3_ENDPOINT_URL"])
    listed = s3.list_objects_v2(Bucket=rclone_s3, Prefix="run/ck/step_00000002/")["Contents"]
    damage_the_newest(s3, rclone_s3, next(o["Key"] for o in listed if o["Key"].endswith(".distcp")), url)
