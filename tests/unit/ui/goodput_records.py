"""A run's goodput records written as the runtime and the trainer write them (manifests indexed as the scheduler
indexes them, a Batch job record, trainer ledger snapshots), for the UI's tests: a 2-node Batch gang on trn1.32xlarge
whose node 1 ran out of memory on attempt 0 and whose retry succeeded, with node 0's ranks idle for stragglers."""

from __future__ import annotations

import gzip
import json
import time

from stoker.client.goodput import JOBS
from stoker.store.goodput import ledger_prefix
from stoker.store.manifest import Manifest, log_name, run_prefix, write_manifest

FLOW = "LedgerFlow"
OOM_EVIDENCE = "log: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


def _snap(created: float, end: float, *, start: int, step: int, final: bool, committed: int | None,
          idle: float | None = None, **seconds: float) -> dict:
    secs = {"init": 0.0, "checkpoint_load": 0.0, "steps": 0.0, "checkpoint_save": 0.0, "eval": 0.0, **seconds}
    return {"kind": "ledger", "version": 1, "time": end, "created_at": created, "process_started_at": created - 4,
            "final": final, "seconds": secs, "start_step": start, "step": step, "committed_step": committed,
            "tokens_per_step": 4096, "saves": 3, "checkpoint_every": 20, "node": 0, "straggler_idle_s": idle}


def _attempt(store, db, run_id: str, task: str, node: int, attempt: int, t0: float, t1: float, status: str,
             exception: dict | None = None) -> None:
    m = Manifest(flow=FLOW, run_id=run_id, step="train", task_id=task, attempt=attempt, status=status, started_at=t0,
                 finished_at=t1, artifacts={}, exception=exception, parallel={"node_index": node, "num_nodes": 2},
                 hostname=f"ip-10-0-0-{node + 1}", user="tester", input_paths=[f"{FLOW}/{run_id}/start/1"],
                 timings={"node_setup": 1.0, "code_package": 4.0},
                 logs={"stderr": log_name(FLOW, run_id, "train", task, attempt, "stderr")})
    store.write(m.logs["stderr"], f"node {node} attempt {attempt}\n".encode())
    write_manifest(store, m)
    db.ingest_manifest(m.to_dict())


def _ledger(store, run_id: str, task: str, attempt: int, *snaps: dict) -> None:
    lines = "".join(json.dumps(s) + "\n" for s in snaps)
    store.write(ledger_prefix(FLOW, run_id, "train", task, attempt) + "000001.jsonl.gz", gzip.compress(lines.encode()))


def _start(store, db, run_id: str, t0: float) -> None:
    m = Manifest(flow=FLOW, run_id=run_id, step="start", task_id="1", attempt=0, status="ok", started_at=t0,
                 finished_at=t0 + 2, artifacts={}, user="tester", hostname="laptop")
    write_manifest(store, m)
    db.ingest_manifest(m.to_dict())


def write_run(store, db, run_id: str, *, t0: float | None = None) -> None:
    """The whole run: a start step, then train: submitted at t0+10, started by Batch at t0+40; node 1's attempt 0
    ran out of memory at t0+150 (node 0 was stopped with it), the retry (a second job) ran to t0+320."""
    t0 = time.time() - 400 if t0 is None else t0
    db.create_run(FLOW, run_id, user="tester", params={"steps": 200})
    _start(store, db, run_id, t0)
    for job, attempt, sub, began in (("j0", 0, t0 + 10, t0 + 40), ("j1", 1, t0 + 160, t0 + 170)):
        ref = {"backend": "batch", "job_id": job, "members": 2, "kind": "gang", "step": "train",
               "task_ids": ["2", "3"], "attempt": attempt, "submitted_at": sub,
               "extra": {"started_at": began, "instance_type": "trn1.32xlarge"}}
        store.write(run_prefix(FLOW, run_id) + JOBS + f"batch-{job}.json", json.dumps(ref).encode())
    oom = {"type": "StokerError", "message": "torchrun exited with code 1 on node 1", "traceback": "",
           "cause": "oom", "evidence": OOM_EVIDENCE}
    stopped = {"type": "TaskDied", "message": "stopped because another task failed", "traceback": "",
               "cause": "oom", "evidence": f"stopped with its gang: node 1 failed: {OOM_EVIDENCE}"}
    for node, task in enumerate(("2", "3")):
        _attempt(store, db, run_id, task, node, 0, t0 + 45, t0 + 150, "failed", oom if node else stopped)
        _ledger(store, run_id, task, 0, _snap(t0 + 55, t0 + 145, start=0, step=80, final=False, committed=60, init=5,
                                              steps=80, checkpoint_save=5, idle=6.0 if node == 0 else None))
        _attempt(store, db, run_id, task, node, 1, t0 + 175, t0 + 320, "ok")
        _ledger(store, run_id, task, 1, _snap(t0 + 185, t0 + 310, start=60, step=200, final=True, committed=200, init=4,
                                              checkpoint_load=6, steps=105, checkpoint_save=6, eval=4,
                                              idle=9.0 if node == 0 else None))
    db.set_run_status(FLOW, run_id, "succeeded")
