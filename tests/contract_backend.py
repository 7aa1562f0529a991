"""A backend that implements only the contract (runtime/contract.py), to show that a new engine needs no
scheduler change. Its members are plain subprocesses running the remote entrypoint
(`python -m stoker.runtime.node --store URL --code KEY --spec KEY`): no pipes, no pidfds, no fork, no shared
memory with the scheduler. Logs come back only through the store, as from a cluster node.

It stands in for a cluster engine (no second machine exists here); the Slurm backend is tested against a real
Slurm cluster in tests/integration/test_slurm_*.py.
"""

from __future__ import annotations

import itertools
import os
import shlex
import signal
import subprocess
import time

from stoker.runtime.contract import EXITED, QUEUED, RUNNING, Backend, JobRef, JobStatus, Request, Unit
from stoker.store.blobs import open_store
from stoker.store.manifest import log_name


class ProcessBackend(Backend):
    name = "contract"
    poll_interval = 0.1

    def __init__(self) -> None:
        self.procs: dict[str, list[subprocess.Popen]] = {}
        self.ids = itertools.count(1)
        self.poll_calls = 0
        self.submitted: list[Request] = []

    def materialize(self, unit: Unit) -> Request:
        return Request(self.name, unit, shlex.join(unit.node_command()) + "\n",
                       payload={"members": unit.size, "gang": unit.kind == "gang"})

    def submit(self, request: Request) -> JobRef:
        unit = request.unit
        job_id = f"c{next(self.ids)}"
        port = str(30000 + os.getpid() % 1000 * 10 + int(job_id[1:]) % 10)
        procs = []
        for i in range(unit.size):
            env = {**os.environ, "STOKER_MEMBER": str(i), "STOKER_MAIN_ADDR": "127.0.0.1", "STOKER_MAIN_PORT": port,
                   "STOKER_NUM_NODES": str(unit.size if unit.kind == "gang" else 1)}
            procs.append(subprocess.Popen(unit.node_command(), env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, start_new_session=True))
        self.procs[job_id] = procs
        self.submitted.append(request)
        return JobRef(self.name, job_id, members=unit.size, kind=unit.kind, step=unit.step,
                      task_ids=[s.task_id for s in unit.specs], attempt=unit.attempt,
                      extra={"store": unit.store_url, "flow": unit.flow, "run_id": unit.run_id})

    def poll(self, refs: list[JobRef]) -> dict[str, JobStatus]:
        self.poll_calls += 1
        out = {}
        for ref in refs:
            procs = self.procs.get(ref.job_id)
            if procs is None:
                continue
            codes = [p.poll() for p in procs]
            members = {i: JobStatus(EXITED if c is not None else RUNNING, exit_code=c, started_at=ref.submitted_at)
                       for i, c in enumerate(codes)}
            if ref.kind == "gang" and any(c not in (None, 0) for c in codes):
                self.cancel(ref, 0)  # the engine ends the whole gang when one node fails
            done = all(c is not None for c in codes)
            out[ref.job_id] = JobStatus(EXITED if done else RUNNING if ref.submitted_at else QUEUED,
                                        exit_code=next((c for c in codes if c), 0) if done else None,
                                        started_at=ref.submitted_at, members=members)
        return out

    def cancel(self, ref: JobRef, grace: float = 3.0, member: int | None = None) -> None:
        procs = self.procs.get(ref.job_id, [])
        for p in procs if member is None else procs[member:member + 1]:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL if grace <= 0 else signal.SIGTERM)
        if grace > 0:
            deadline = time.time() + grace
            while time.time() < deadline and any(p.poll() is None for p in self.procs.get(ref.job_id, [])):
                time.sleep(0.05)
            for p in self.procs.get(ref.job_id, []):
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)

    def logs(self, ref: JobRef, member: int = 0, stream: str = "stdout") -> bytes:
        store = open_store(ref.extra["store"])
        name = log_name(ref.extra["flow"], ref.extra["run_id"], ref.step, ref.task_ids[member], ref.attempt, stream)
        return store.read(name) if store.exists(name) else b""
