"""The S3 rows of benchmarks/checkpoint.py that compare stoker's transfers with what a user would otherwise run:

  boto3 upload_file     the torch.save file uploaded by boto3's own managed transfer, default TransferConfig
  boto3 download_file   and downloaded back the same way
  stoker put_file       the same file through stoker.store.objects (parallel multipart, $STOKER_S3_* settings)
  stoker get_file       and back (parallel ranged GETs; given no checksum, as download_file is given none)
  torch.save + upload   torch.save to local disk (fsync) then boto3 upload_file: the usual "save then copy"
  download + torch.load boto3 download_file then torch.load: its resume

The ratios printed compare stoker's checkpoint save / load (the Checkpointer rows: DCP streamed straight into
multipart uploads; parallel ranged reads checked against the manifest) and its raw transfers with boto3's.
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from typing import Any

# moto joins a multipart upload's parts in one request: for a GB object on busy cores that outlasts botocore's
# 60 s read timeout (the retried CompleteMultipartUpload then fails): the baseline gets the same long timeout
# as stoker (STOKER_S3_READ_TIMEOUT); everything else about it is boto3's default.
READ_TIMEOUT_S = 900


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process: the client's transfers
    return r.ru_utime + r.ru_stime


class _Clock:
    """Wall time of each call, and the CPU seconds this process (the client) and the server spent on it."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.cpu: dict[str, list[tuple[float, float]]] = {}

    def __call__(self, what: str, fn: Any) -> float:
        c0, s0 = _cpu(), self.server.cpu_seconds() if self.server else float("nan")
        t0 = time.perf_counter()
        fn()
        secs = time.perf_counter() - t0
        s1 = self.server.cpu_seconds() if self.server else float("nan")
        self.cpu.setdefault(what, []).append((_cpu() - c0, s1 - s0))
        return secs

    def note(self, what: str) -> str:
        if what not in self.cpu:
            return ""
        client = statistics.median(c for c, _ in self.cpu[what])
        server = statistics.median(s for _, s in self.cpu[what])
        return f"; CPU: client {client:.1f} s, {self.server.kind if self.server else 'server'} {server:.1f} s"


def measure_transfer(target: Any, bench: Any, Row: Any) -> list[Any]:  # noqa: N803 - the bench's Row class
    """Rows for the s3 target only (see the module docstring)."""
    if target.bucket is None:
        return []
    import boto3
    import torch
    from botocore.config import Config

    from stoker.store.objects import open_objects

    client = boto3.client("s3", endpoint_url=target.env["STOKER_S3_ENDPOINT_URL"],
                          config=Config(read_timeout=READ_TIMEOUT_S))
    path, back = target.scratch / "baseline.pt", target.scratch / "baseline.back"
    rows: dict[str, list[float]] = {k: [] for k in ("boto3 upload_file", "boto3 download_file", "stoker put_file",
                                                    "stoker get_file", "torch.save + upload", "download + torch.load")}
    objects = open_objects(f"s3://{target.bucket}/transfer")
    clock = _Clock(getattr(target, "server", None))
    for _ in range(bench.repeat):
        def save() -> None:
            with open(path, "wb") as f:
                torch.save(bench.state, f)
                f.flush()
                os.fsync(f.fileno())

        saved = clock("torch.save", save)
        size = path.stat().st_size
        up = clock("boto3 upload_file", lambda: client.upload_file(str(path), target.bucket, "baseline/state.pt"))
        rows["boto3 upload_file"].append(up)
        rows["torch.save + upload"].append(saved + up)
        down = clock("boto3 download_file", lambda: client.download_file(target.bucket, "baseline/state.pt", str(back)))
        rows["boto3 download_file"].append(down)
        load = clock("torch.load", lambda: torch.load(back, map_location="cpu", weights_only=True))
        rows["download + torch.load"].append(down + load)
        back.unlink()
        rows["stoker put_file"].append(clock("stoker put_file", lambda: objects.put_file("state.pt", path)))
        rows["stoker get_file"].append(clock("stoker get_file", lambda: objects.get_file("state.pt", back)))
        back.unlink()
        client.delete_object(Bucket=target.bucket, Key="baseline/state.pt")
        objects.delete("state.pt")
    path.unlink(missing_ok=True)
    notes = {"boto3 upload_file": "default TransferConfig (8 MB parts, 10 threads)",
             "boto3 download_file": "default TransferConfig", "stoker put_file": "parallel multipart",
             "stoker get_file": "parallel ranged GETs, no checksum given",
             "torch.save + upload": "local file, then upload_file",
             "download + torch.load": "download_file, then torch.load"}
    return [Row(target.name, what, secs, size, notes[what] + clock.note(what)) for what, secs in rows.items()]


def transfer_summary(rows: list[Any]) -> dict[str, Any]:
    """Throughput ratios of stoker over boto3's default transfer (> 1: stoker is faster)."""
    by = {(r.target, r.what): r.median for r in rows}
    if ("s3", "boto3 upload_file") not in by:
        return {}

    def ratio(a: str, b: str) -> float | None:
        return round(by[("s3", b)] / by[("s3", a)], 3) if ("s3", a) in by and ("s3", b) in by else None

    return {"goal": 2.0,
            "put_file_vs_boto3_upload_file": ratio("stoker put_file", "boto3 upload_file"),
            "get_file_vs_boto3_download_file": ratio("stoker get_file", "boto3 download_file"),
            "checkpoint_save_vs_boto3_upload_file": ratio("sync save", "boto3 upload_file"),
            "checkpoint_save_vs_torch_save_plus_upload": ratio("sync save", "torch.save + upload"),
            "checkpoint_load_vs_boto3_download_file": ratio("load", "boto3 download_file"),
            "checkpoint_load_vs_download_plus_torch_load": ratio("load", "download + torch.load")}


def print_transfer(summary: dict[str, Any]) -> None:
    if not summary:
        return
    print("\ns3: stoker vs boto3 default (throughput ratio; goal ≥ 2.0):")
    for k, v in summary.items():
        if k != "goal":
            print(f"  {k}: {v}")
