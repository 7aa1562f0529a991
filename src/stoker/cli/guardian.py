"""Cluster jobs never outlive their run: `stoker kill FLOW/RUN`, and a guardian for a `run` that dies.

Every submission's JobRef is in the store (runs/FLOW/RUN/jobs/). `stoker kill` polls them, cancels the live
ones and interrupts the run process when it runs on this host. The guardian is a small process started with
the first cluster submission; when the `run` process ends without saying "done" (killed with SIGKILL, or
crashed), it cancels every job of the run that is still live and says which it could not cancel.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import IO, Any

from stoker.runtime.contract import EXITED, JobRef
from stoker.runtime.driver.jobs import jobs_prefix, kill_request_name
from stoker.store.blobs import BlobStore, open_store
from stoker.store.manifest import read_run_record, write_run_record


def job_refs(store: BlobStore, flow: str, run_id: str) -> list[JobRef]:
    prefix = jobs_prefix(flow, run_id)
    return [JobRef.from_json(store.read(n)) for n in store.list(prefix) if n.endswith(".json")]


def cancel_jobs(refs: list[JobRef], grace: float | None = None) -> tuple[list[JobRef], list[tuple[JobRef, str]]]:
    """Cancel the refs that are still live (SIGTERM, then force after `grace`, default $STOKER_KILL_GRACE: time for
    a checkpoint); returns (cancelled, [(ref, why it could not be)])."""
    from stoker._process import kill_grace
    from stoker.backends import make_backend

    grace = kill_grace() if grace is None else grace

    cancelled, failed = [], []
    by_backend: dict[str, list[JobRef]] = {}
    for r in refs:
        by_backend.setdefault(r.backend, []).append(r)
    for name, group in by_backend.items():
        try:
            backend = make_backend(name)
            statuses = backend.poll(group)
        except Exception as e:  # noqa: BLE001 - reported per job
            failed += [(r, str(e)) for r in group]
            continue
        asked = []
        for r in group:
            s = statuses.get(r.job_id)
            if s is None or s.state == EXITED:
                continue
            try:
                backend.cancel(r, grace)
                asked.append(r)
            except Exception as e:  # noqa: BLE001
                failed.append((r, str(e)))
        _let_them_stop(backend, asked, grace)
        backend.close()  # forces what was asked to stop nicely and has not stopped within its grace
        cancelled += asked
    return cancelled, failed


def _let_them_stop(backend: Any, refs: list[JobRef], grace: float) -> None:
    """Wait until every job asked to stop has ended, or `grace` is over (a checkpoint is being written)."""
    deadline = time.monotonic() + grace
    while refs and time.monotonic() < deadline:
        backend.wait(min(1.0, max(0.0, deadline - time.monotonic())), lambda *a: None)
        try:
            statuses = backend.poll(refs)
        except Exception:  # noqa: BLE001 - the engine is unreachable: close() forces what it can
            return
        refs = [r for r in refs if (s := statuses.get(r.job_id)) is not None and s.state != EXITED]


def kill_run(store: BlobStore, flow: str, run_id: str, out: IO[str] = sys.stdout) -> int:
    record = read_run_record(store, flow, run_id)
    if record is None:
        from stoker.errors import StokerError

        raise StokerError(f"run {flow}/{run_id} is not in the store {store.url}: see `stoker runs {flow}`")
    store.write(kill_request_name(flow, run_id), json.dumps({"by": socket.gethostname(), "at": time.time()}).encode())
    pid, host = record.get("pid"), record.get("host")
    if record.get("status") == "running" and pid and host == socket.gethostname():
        try:
            os.kill(int(pid), signal.SIGINT)  # the run stops its tasks and marks itself killed
            print(f"interrupted the run process {pid}", file=out)
        except ProcessLookupError:
            pass
    cancelled, failed = cancel_jobs(job_refs(store, flow, run_id))
    for r in cancelled:
        print(f"cancelled {r.backend} job {r.job_id} ({r.step}, attempt {r.attempt})", file=out)
    for r, why in failed:
        print(f"could NOT cancel {r.backend} job {r.job_id} ({r.step}): {why}", file=out)
    if not cancelled and not failed:
        print(f"no live jobs in {flow}/{run_id}", file=out)
    return 1 if failed else 0


class Guardian:
    """The `on_submit` hook of a run: starts the guardian process at the first persisted submission."""

    def __init__(self, flow: str) -> None:
        self.flow = flow
        self.proc: subprocess.Popen | None = None

    def __call__(self, ref: JobRef, store_url: str, run_id: str) -> None:
        if self.proc is None:
            self.proc = subprocess.Popen([sys.executable, "-m", "stoker.cli.guardian", "--store", store_url,
                                          "--flow", self.flow, "--run", run_id], stdin=subprocess.PIPE,
                                         start_new_session=True)

    def done(self) -> None:
        """The run ended in order (its jobs are finished or cancelled): the guardian just exits."""
        if self.proc and self.proc.stdin:
            try:
                self.proc.stdin.write(b"done\n")
                self.proc.stdin.close()
            except OSError:
                pass


def start_guardian(flow: str) -> Guardian:
    return Guardian(flow)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m stoker.cli.guardian")
    ap.add_argument("--store", required=True)
    ap.add_argument("--flow", required=True)
    ap.add_argument("--run", required=True)
    a = ap.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for the run, which cancels in order
    said = sys.stdin.buffer.read()  # EOF when the run process ends, however it ends
    if said.strip() == b"done":
        return
    store = open_store(a.store)
    cancelled, failed = cancel_jobs(job_refs(store, a.flow, a.run))
    report = {"cancelled": [r.job_id for r in cancelled], "not_cancelled": [[r.job_id, w] for r, w in failed]}
    record = read_run_record(store, a.flow, a.run)
    if record is not None and record.get("status") == "running":  # the run died: say so where users look
        write_run_record(store, {**record, "status": "failed", "finished_at": time.time(), "guardian": report})
        try:
            from stoker.store.metadata import MetadataDB
            from stoker.store.paths import default_db_path

            MetadataDB(default_db_path()).set_run_status(a.flow, a.run, "failed", finished_at=time.time())
        except Exception:  # noqa: BLE001 - the store is the truth; the index can be rebuilt from it
            pass
    if cancelled or failed:
        print(f"stoker guardian: the run {a.flow}/{a.run} ended without stopping its jobs: {json.dumps(report)}",
              file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
