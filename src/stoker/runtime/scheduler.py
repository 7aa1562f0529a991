"""The scheduler: an explicit state machine over task attempts, the single writer of the metadata index.

States of a task: pending -> running -> ok | failed, with failed -> pending again while retries are left
(`waiting` until minutes_between_retries has passed). Gangs (num_parallel) move as one unit: admitted together,
stopped together when one node dies, retried together.
"""

from __future__ import annotations

import logging
import os
import select
import selectors
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..backends.base import Executor, TaskHandle
from ..flow.decorators import get_decorator
from ..flow.graph import FlowGraph
from ..store.blob import BlobStore
from ..store.manifest import clone_manifest, log_name, read_manifest, write_manifest
from ..store.metadata import MetadataDB
from .output import Display, TaskOutput
from .resources import ResourcePool, step_resources
from .spec import TaskSpec
from .task import run_task

log = logging.getLogger(__name__)
KILL_GRACE_S = 3.0


def frames_key(frames: list[dict]) -> tuple:
    return tuple((f["step"], f["index"]) for f in frames)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Task:
    step: str
    task_id: str
    inputs: list[dict]
    foreach: list[dict]
    max_attempts: int
    parallel: dict | None = None
    gang: str | None = None
    attempt: int = 0
    state: str = "pending"  # pending | running | ok | failed | killed
    not_before: float = 0.0
    handle: TaskHandle | None = None
    output: TaskOutput | None = None
    started: float = 0.0
    deadline: float | None = None
    kill_at: float | None = None
    stop_reason: str | None = None
    manifest: dict | None = None
    exit_code: int | None = None
    cloned: bool = False

    @property
    def key(self) -> tuple:
        return (self.step, frames_key(self.foreach))

    def ref(self) -> dict:
        return {"step": self.step, "task_id": self.task_id, "attempt": self.attempt}


@dataclass
class RunResult:
    run_id: str
    status: str  # succeeded | failed | killed
    failures: list[str] = field(default_factory=list)


class Scheduler:
    def __init__(self, *, flow_cls: type, graph: FlowGraph, run_id: str, store: BlobStore, db: MetadataDB,
                 executor: Executor, run_inputs: dict[str, dict], user: str, tags: list[str],
                 max_workers: int = 16, origin: dict[tuple, dict] | None = None, origin_run_id: str | None = None,
                 rerun_steps: set[str] | None = None, flow_file: str = "", with_specs: list[str] | None = None,
                 display: Display | None = None, log_root: Path | None = None) -> None:
        self.flow_cls, self.graph, self.run_id = flow_cls, graph, run_id
        self.store, self.db, self.executor = store, db, executor
        self.flow = graph.name
        self.run_inputs, self.user, self.tags = run_inputs, user, tags
        self.max_workers = max(1, max_workers)
        self.origin, self.origin_run_id = origin or {}, origin_run_id
        self.rerun_steps = rerun_steps or set()
        self.flow_file, self.with_specs = flow_file, with_specs or []
        self.display = display or Display(f"{self.flow}/{run_id}")
        self.log_root = log_root or Path(os.environ.get("TMPDIR", "/tmp")) / "stoker-logs"
        self.tasks: list[Task] = []
        self.joins: dict[tuple, dict[int, Task]] = {}
        self.pool = ResourcePool.from_capabilities(executor.capabilities())
        self.sel = selectors.DefaultSelector()
        self.failures: list[str] = []
        self.gang_failures: dict[str, tuple[Task, float]] = {}  # gang -> (first failed node, when)
        self.failed = False
        self.interrupted = False
        self._stopping = False
        self._next_id = 0

    # -- building tasks ---------------------------------------------------------------------------
    def _new_id(self) -> str:
        self._next_id += 1
        return str(self._next_id)

    def _add(self, step: str, inputs: list[Task], foreach: list[dict], parallel: dict | None = None,
             gang: str | None = None, task_id: str | None = None) -> Task:
        func = getattr(self.flow_cls, step)
        retry = get_decorator(func, "retry")
        t = Task(step=step, task_id=task_id or self._new_id(), inputs=[i.ref() for i in inputs], foreach=foreach,
                 max_attempts=1 + (int(retry.attributes["times"]) if retry else 0), parallel=parallel, gang=gang)
        self.tasks.append(t)
        return t

    def _successors(self, t: Task) -> None:
        node = self.graph[t.step]
        nxt = (t.manifest or {}).get("next") or {}
        if node.kind == "foreach":
            n, var = nxt["num_splits"], nxt["foreach_var"]
            desc = t.manifest["artifacts"][var]
            for i in range(n):
                self._add(node.out_funcs[0], [t], t.foreach + [{"step": t.step, "var": var, "index": i,
                                                                 "num_splits": n, "desc": desc}])
        elif node.kind == "parallel":
            self._add_gang(node.out_funcs[0], t, int(nxt["num_parallel"]))
        else:
            for target in node.out_funcs:
                if self.graph[target].is_join:
                    self._arrive(target, t)
                else:
                    self._add(target, [t], list(t.foreach))

    def _add_gang(self, step: str, parent: Task, n: int) -> None:
        port, gang = free_port(), f"{step}-{self._next_id + 1}"
        ids = [self._new_id() for _ in range(n)]
        for i in range(n):
            par = {"main_ip": "127.0.0.1", "num_nodes": n, "node_index": i, "port": port, "control_task_id": ids[0]}
            self._add(step, [parent], parent.foreach + [{"step": parent.step, "var": None, "index": i,
                                                          "num_splits": n}], parallel=par, gang=gang, task_id=ids[i])

    def _arrive(self, join: str, t: Task) -> None:
        split = self.graph.closing_split(join)
        if split.kind in ("foreach", "parallel"):
            outer, idx, expected = t.foreach[:-1], t.foreach[-1]["index"], t.foreach[-1]["num_splits"]
        else:
            outer, idx, expected = t.foreach, self.graph[join].in_funcs.index(t.step), len(self.graph[join].in_funcs)
        bucket = self.joins.setdefault((join, frames_key(outer)), {})
        bucket[idx] = t
        if len(bucket) == expected:
            self._add(join, [bucket[i] for i in sorted(bucket)], list(outer))

    # -- launching --------------------------------------------------------------------------------
    def _units(self, now: float) -> list[list[Task]]:
        units: dict[str, list[Task]] = {}
        for t in self.tasks:
            if t.state == "pending":
                units.setdefault(t.gang or t.task_id, []).append(t)
        return [u for u in units.values() if all(t.not_before <= now for t in u)]

    def _admit(self) -> None:
        now = time.time()
        for unit in self._units(now):
            if self.failed or self.interrupted:
                return
            if self._clone(unit):
                continue
            running = sum(1 for t in self.tasks if t.state == "running")
            need = [step_resources(getattr(self.flow_cls, t.step)) for t in unit]
            if running and (running + len(unit) > self.max_workers or not self.pool.fits(need)):
                continue
            for t, r in zip(unit, need, strict=True):
                self.pool.take(r)
                self._launch(t)

    def _clone(self, unit: list[Task]) -> bool:
        """On resume, reuse the origin run's successful task for the same step and foreach position."""
        if not self.origin or unit[0].step in self.rerun_steps:
            return False
        by_id = {t.task_id: t for t in self.tasks}
        if not all(by_id[i["task_id"]].cloned for t in unit for i in t.inputs):
            return False  # an input was run again, so this task must run again too
        found = [self.origin.get(t.key) for t in unit]
        if not all(found):
            return False
        for t, m in zip(unit, found, strict=True):
            clone = clone_manifest(m, run_id=self.run_id, task_id=t.task_id, user=self.user)
            clone["input_paths"] = self._spec(t).input_paths()
            write_manifest(self.store, clone)
            self.db.ingest_manifest(clone)
            t.manifest, t.state, t.cloned = clone, "ok", True
            self.display.line(t.step, self._prefix(t), f"cloned from {clone['origin_task']}")
            self.display.count("done")
        for t in unit:
            self._successors(t)
        return True

    def _prefix(self, t: Task) -> str:
        return f"{self.run_id}/{t.step}/{t.task_id}" + (f"/attempt {t.attempt}" if t.attempt else "")

    def _spec(self, t: Task) -> TaskSpec:
        return TaskSpec(flow=self.flow, run_id=self.run_id, step=t.step, task_id=t.task_id, attempt=t.attempt,
                        max_attempts=t.max_attempts, inputs=t.inputs, foreach=t.foreach, parallel=t.parallel,
                        run_inputs=self.run_inputs, user=self.user, tags=self.tags,
                        origin_run_id=self.origin_run_id, store_url=self.store.url, flow_file=self.flow_file,
                        flow_class=self.flow_cls.__name__, with_decorators=self.with_specs)

    def _launch(self, t: Task) -> None:
        spec = self._spec(t)
        env = {"STOKER_RUN_ID": self.run_id, "STOKER_TASK_PATHSPEC": spec.pathspec}
        t.output = TaskOutput(self.log_root / self.flow / self.run_id / t.step / f"{t.task_id}.{t.attempt}",
                              self._prefix(t))
        t.handle = self.executor.launch(spec, env, lambda: run_task(self.flow_cls, spec, self.store, self.graph))
        t.state, t.started, t.kill_at, t.stop_reason = "running", time.time(), None, None
        tmo = get_decorator(getattr(self.flow_cls, t.step), "timeout")
        t.deadline = t.started + tmo.total_seconds + 5 if tmo else None
        for fd, stream in zip(t.handle.fds, ("stdout", "stderr"), strict=False):
            self.sel.register(fd, selectors.EVENT_READ, (t, stream))
        if t.handle.exit_fd is not None:
            self.sel.register(t.handle.exit_fd, selectors.EVENT_READ, (t, "exit"))
        self.display.count("running")

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> RunResult:
        old = signal.signal(signal.SIGINT, self._on_sigint)
        old_term = signal.signal(signal.SIGTERM, self._on_sigint)
        try:
            self._add("start", [], [])
            while True:
                self._check_interrupt()
                if not self.failed and not self.interrupted:
                    self._admit()
                running = [t for t in self.tasks if t.state == "running"]
                if not running:
                    if self.failed or self.interrupted or not any(t.state == "pending" for t in self.tasks):
                        break
                self._pump(0.05 if running else min(0.5, self._next_wakeup()))
                self._check_interrupt()
                self._reap()
                self.display.refresh()
        finally:
            signal.signal(signal.SIGINT, old)
            signal.signal(signal.SIGTERM, old_term)
            self.sel.close()
            self.display.close()
        status = "killed" if self.interrupted else "failed" if self.failed else "succeeded"
        if status == "succeeded" and not any(t.step == "end" and t.state == "ok" for t in self.tasks):
            status = "failed"
        return RunResult(self.run_id, status, self.failures)

    def _next_wakeup(self) -> float:
        waits = [t.not_before - time.time() for t in self.tasks if t.state == "pending"]
        return max(0.01, min(waits)) if waits else 0.05

    def _on_sigint(self, signum: int, frame: Any) -> None:
        self.interrupted = True  # acted on by the loop, never in the middle of a launch

    def _check_interrupt(self) -> None:
        if self.interrupted and not self._stopping:
            self._stopping = True
            self.display.info("interrupted: stopping all tasks", style="bold red")
            self._stop_all("the run was interrupted")

    def _pump(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout):
            t, stream = key.data
            if stream == "exit":  # the task exited: stop watching; _reap collects it right away
                self.sel.unregister(key.fd)
                os.close(key.fd)
                t.handle.exit_fd = None
            else:
                self._read(t, stream, key.fd)

    def _read(self, t: Task, stream: str, fd: int) -> bool:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return True
        except OSError:
            data = b""
        if not data:
            self.sel.unregister(fd)
            os.close(fd)
            return False
        for line in t.output.feed(stream, data):
            self.display.line(t.step, self._prefix(t), line, stream)
        return True

    def _reap(self) -> None:
        now = time.time()
        for t in [t for t in self.tasks if t.state == "running"]:
            code = t.handle.poll()
            if code is None:
                if t.deadline and now > t.deadline and not t.kill_at:
                    self._stop(t, "it exceeded its @timeout", hard=True)
                elif t.kill_at and now > t.kill_at:
                    t.handle.signal(signal.SIGKILL)
                continue
            t.handle.signal(signal.SIGKILL, tree=False)  # stragglers left in its process group
            self._drain(t)
            self._finish(t, code)

    def _drain(self, t: Task) -> None:
        if t.handle.exit_fd is not None:
            self.sel.unregister(t.handle.exit_fd)
            os.close(t.handle.exit_fd)
            t.handle.exit_fd = None
        for fd, stream in zip(t.handle.fds, ("stdout", "stderr"), strict=False):
            if fd in self.sel.get_map():
                deadline = time.time() + 1.0
                while time.time() < deadline and fd in self.sel.get_map():
                    ready, _, _ = select.select([fd], [], [], 0.1)
                    if not ready or not self._read(t, stream, fd):
                        break  # nothing more now (a straggler may hold the pipe open), or EOF
                if fd in self.sel.get_map():
                    self.sel.unregister(fd)
                    os.close(fd)
        for stream, line in t.output.close():
            self.display.line(t.step, self._prefix(t), line, stream)

    def _stop(self, t: Task, reason: str, hard: bool = False) -> None:
        if t.state != "running" or t.kill_at or t.handle.poll() is not None:
            return  # not running, already being stopped, or already dead (its own outcome stands)
        t.stop_reason = reason
        t.handle.signal(signal.SIGKILL if hard else signal.SIGTERM)
        t.kill_at = time.time() + (0 if hard else KILL_GRACE_S)

    def _stop_all(self, reason: str) -> None:
        for t in self.tasks:
            self._stop(t, reason)

    # -- outcomes ---------------------------------------------------------------------------------
    def _finish(self, t: Task, code: int) -> None:
        self.pool.give(step_resources(getattr(self.flow_cls, t.step)))
        self.display.count("running", -1)
        t.exit_code = code
        for stream in ("stdout", "stderr"):
            self.store.write(log_name(self.flow, self.run_id, t.step, t.task_id, t.attempt, stream),
                             t.output.read(stream), durable=False)
        try:
            m = read_manifest(self.store, self.flow, self.run_id, t.step, t.task_id, t.attempt)
        except Exception:  # noqa: BLE001 - a killed task writes none; we write it
            m = None
        if code == 0 and m and m.get("status") == "ok":
            t.manifest, t.state = m, "ok"
            self.db.ingest_manifest(m)
            self.display.count("done")
            if t.gang and not all(g.state == "ok" for g in self._gang(t)):
                return
            for g in self._gang(t) if t.gang else [t]:
                self._successors(g)
            return
        m = m or self._failure_manifest(t, code)
        if m.get("status") == "ok":
            m = dict(m, status="failed", exception={"type": "ExitCode", "message": f"exit code {code}",
                                                    "traceback": ""})
            write_manifest(self.store, m)
        self.db.ingest_manifest(m)
        t.manifest, t.state = m, ("killed" if t.stop_reason and not t.stop_reason.startswith("it exceeded")
                                  else "failed")
        if t.gang:
            self._gang_failed(t)
        else:
            self._retry_or_fail([t])

    def _failure_manifest(self, t: Task, code: int) -> dict:
        if code < 0:
            sig = -code
            how = f"killed by signal {signal.Signals(sig).name if sig in signal.valid_signals() else sig}"
        else:
            how = f"exited with code {code}"
        why = f" because {t.stop_reason}" if t.stop_reason else ""
        m = {**self._spec(t).manifest_head(t.started), "status": "failed", "finished_at": time.time(),
             "artifacts": {}, "exception": {"type": "TaskDied", "message": f"task process {how}{why}",
                                            "traceback": ""}}
        write_manifest(self.store, m)
        return m

    def _gang(self, t: Task) -> list[Task]:
        return [g for g in self.tasks if g.gang == t.gang]

    def _gang_failed(self, t: Task) -> None:
        gang = self._gang(t)
        live = [g for g in gang if g.state == "running"]
        if t.state == "failed" and t.gang not in self.gang_failures:
            node = t.parallel["node_index"]
            self.display.info(f"gang {t.step}: node {node} (task {t.task_id}) failed: {self._why(t)}; "
                              f"stopping the other {len(live)} node(s)", style="bold red")
            for g in live:
                self._stop(g, "gang")
            self.gang_failures[t.gang] = (t, time.time())
        if live:
            return
        first, since = self.gang_failures.pop(t.gang, (t, None))
        if since is not None:
            self.display.info(f"gang {t.step} stopped {time.time() - since:.1f} s after node "
                              f"{first.parallel['node_index']} failed")
        self._retry_or_fail(gang, first)

    def _why(self, t: Task) -> str:
        exc = (t.manifest or {}).get("exception") or {}
        return f"{exc.get('type', '?')}: {exc.get('message', '')}".strip()

    def _retry_or_fail(self, unit: list[Task], first: Task | None = None) -> None:
        first = first or unit[0]
        if self.interrupted or first.stop_reason in ("another task failed", "the run was interrupted"):
            return
        if first.attempt + 1 < first.max_attempts and not self.failed:
            retry = get_decorator(getattr(self.flow_cls, first.step), "retry")
            delay = 60 * float(retry.attributes["minutes_between_retries"]) if retry else 0
            self.display.info(f"[{self._prefix(first)}] failed ({self._why(first)}); "
                              f"{'the gang ' if first.gang else ''}retry {first.attempt + 1} of "
                              f"{first.max_attempts - 1}" + (f" in {delay:.0f} s" if delay else ""),
                              style="yellow")
            port = free_port()  # a fresh rendezvous port: stragglers of the last attempt may hold the old one
            for g in unit:
                if g.parallel:
                    g.parallel = dict(g.parallel, port=port)
                g.attempt += 1
                g.state, g.not_before, g.manifest, g.handle = "pending", time.time() + delay, None, None
            return
        self.failed = True
        self.display.count("failed")
        tail = "\n    ".join(list(first.output.tail)[-15:]) if first.output else ""
        msg = (f"step {first.step} (task {self.flow}/{self.run_id}/{first.step}/{first.task_id}"
               + (f", gang node {first.parallel['node_index']}" if first.parallel else "")
               + f") failed after {first.attempt + 1} attempt(s): {self._why(first)}")
        self.failures.append(msg + (f"\n  last lines of its log:\n    {tail}" if tail else ""))
        self._stop_all("another task failed")
