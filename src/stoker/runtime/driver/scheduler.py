"""The scheduler: an explicit state machine over task attempts, the single writer of the metadata index.

States of a task: pending -> running -> ok | failed, with failed -> pending again while retries are left
(`waiting` until minutes_between_retries has passed). Gangs (num_parallel) move as one unit: admitted together,
stopped together when one node dies, retried together.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stoker.distributed.smoke import cap_gang
from stoker.errors import StokerError
from stoker.features.hooks import attempt_delay_s, attempts_allowed, deadline, gang_spares
from stoker.runtime.contract import EXITED, Backend, InProcessBackend, JobRef, JobStatus, Unit
from stoker.runtime.driver.attribution import Attribution
from stoker.runtime.driver.causes import CONFIG, NEVER_STARTS, PREEMPTION, signal_of  # NEVER_STARTS: no attempt helps
from stoker.runtime.driver.context import RunContext
from stoker.runtime.driver.failures import FIX_AND_RERUN, kill_grace, requeue_preempted
from stoker.runtime.driver.fallback import crash_note, died_how, fallback_note
from stoker.runtime.driver.gangview import node_states
from stoker.runtime.driver.jobs import build_unit, job_record_name, kill_request_name, node_need
from stoker.runtime.driver.lostnodes import NodeWatch, gang_failed, watch_gang
from stoker.runtime.driver.output import Display, TaskOutput, private_log_root, store_logs
from stoker.runtime.driver.queue import Task, TaskIndex
from stoker.runtime.driver.resources import ResourcePool  # this machine's capacity (not the decorator's module)
from stoker.runtime.driver.spares import Spares
from stoker.runtime.driver.transitions import NewTask, Transitions, first_task
from stoker.runtime.package import stage_package
from stoker.runtime.spec import TaskSpec
from stoker.store.manifest import (
    Manifest,
    clone_manifest,
    handed_manifest,
    log_name,
    manifest_name,
    manifest_outcome,
    write_manifest,
)

log = logging.getLogger(__name__)
KILL_GRACE_S = kill_grace()  # $STOKER_KILL_GRACE, default 30 s: time for a checkpoint (runtime/driver/failures.py)
CANCEL_WAIT_S = 30.0  # after a stop, how long to wait for a remote engine to confirm that its jobs ended
LOST_AFTER_S = 120.0  # a job the engine has not heard of for this long is lost
MAX_ARRAY = 1000  # elements per job array (Slurm's default MaxArraySize is 1001)
FAST_POLL_S = 0.1  # right after a submission or a change, a remote engine is polled this soon, then less often


@dataclass
class RunResult:
    run_id: str
    status: str  # succeeded | failed | killed
    failures: list[str] = field(default_factory=list)


class Scheduler:
    def __init__(self, ctx: RunContext, *, max_workers: int = 16, display: Display | None = None,
                 log_root: Path | None = None, on_submit: Callable[[JobRef, str, str], None] | None = None) -> None:
        self.ctx = ctx  # the run-wide values (runtime/driver/context.py); the names below are its, for brevity
        self.flow_cls, self.graph, self.run_id, self.flow = ctx.flow_cls, ctx.graph, ctx.run_id, ctx.flow
        self.store, self.db, self.router = ctx.store, ctx.db, ctx.router
        self.user, self.origin, self.rerun_steps = ctx.user, ctx.origin, ctx.rerun_steps
        self.on_submit = on_submit
        self.max_workers = max(1, max_workers)
        self.display = display or Display(f"{self.flow}/{self.run_id}")
        self.log_root = log_root or private_log_root()  # never a predictable shared /tmp path
        self.index = TaskIndex()  # every task by id, gang and state, and the queue of pending units
        self.tasks: list[Task] = self.index.all
        self.transitions = Transitions(self.graph, self.index.new_id,  # what a finished task starts
                                       lambda step, n: cap_gang(self.store, self.flow, self.run_id, step, n))
        self.pool: ResourcePool | None = None  # admission for backends on this machine
        self.backends: dict[str, Backend] = {}  # the ones used so far
        self.live: dict[tuple[str, str], tuple[JobRef, list[Task]]] = {}  # (backend, job id) -> (ref, tasks)
        self.last_poll: dict[str, float] = {}
        self.poll_gap: dict[str, float] = {}  # seconds to the next poll: short after a change, then backing off
        self.unseen: dict[tuple[str, str], float] = {}  # jobs the engine did not report, since when
        self.stop_deadline: float | None = None
        self.failures: list[str] = []
        self.gang_failures: dict[str, tuple[Task, float]] = {}  # gang -> (first failed node, when)
        self.watch = NodeWatch(self.store, self.flow, self.run_id)  # remote gangs' heartbeats
        self.spares = Spares(self.store, self.flow, self.run_id,
                             lambda text, style: self.display.info(text, style=style), self.watch)  # hot spares
        self.causes = Attribution(self.store, self.flow_cls, self.graph)  # why each attempt failed; what it means
        self.failed = False
        self.interrupted = False
        self._stopping: bool | str = False
        self.hard_stop = False
        self._index_ops: list[tuple[str, Any]] = []  # index writes of this pass: one transaction (_flush_index)

    # -- building tasks ---------------------------------------------------------------------------
    def _add(self, new: NewTask) -> Task:
        t = Task(step=new.step, task_id=new.task_id or self.index.new_id(), inputs=[i.ref() for i in new.inputs],
                 foreach=new.foreach, max_attempts=attempts_allowed(getattr(self.flow_cls, new.step)),
                 parallel=new.parallel, gang=new.gang, iteration=new.iteration)
        self.index.add(t)
        return t

    def _successors(self, t: Task) -> None:
        for new in self.transitions.successors(t):  # runtime/driver/transitions.py: splits, foreaches, gangs,
            self._add(new)  # switches, joins

    def _add_gang(self, step: str, parent: Task, n: int) -> None:
        for new in self.transitions.gang(step, parent, n):
            self._add(new)

    # -- launching --------------------------------------------------------------------------------
    def _backend(self, step: str) -> Backend:
        b = self.router(step)
        if b.name not in self.backends:
            self.backends[b.name] = b
            if not b.remote and self.pool is None:
                self.pool = ResourcePool.from_capabilities(b.capabilities())
        return b

    def _admit(self) -> None:
        """Start what may start: O(steps + units started) per pass, however many tasks are pending."""
        if self.failed or self.interrupted:
            return
        arrays: dict[tuple, list[Task]] = {}
        admission = self.index.admission(time.time())
        try:
            for unit in admission:
                if self.failed or self.interrupted:
                    admission.hold(unit)
                    return
                if self._clone(unit):
                    continue
                backend = self._backend(unit[0].step)
                if backend.arrays and not unit[0].gang:  # gathered below into one submission per step
                    arrays.setdefault((backend.name, unit[0].step, unit[0].attempt), []).extend(unit)
                    continue
                # units behind this one in its queue ask for as much: none fits either (unless it can be cloned)
                cloneable = bool(self.origin) and unit[0].step not in self.rerun_steps
                running = self.index.count("running")
                if running and running + len(unit) > self.max_workers:
                    admission.hold(unit, block=not cloneable)
                    continue
                if not backend.remote:
                    need = [node_need(self.flow_cls, t.step) for t in unit]
                    if running and not self.pool.fits(need):
                        admission.hold(unit, block=not cloneable)
                        continue
                    for r in need:
                        self.pool.take(r)
                self._submit(unit, backend)
        finally:
            admission.close()
        for (name, _, _), tasks in arrays.items():  # one array a step, the engine runs max_workers at once
            for i in range(0, len(tasks), MAX_ARRAY):
                self._submit(tasks[i:i + MAX_ARRAY], self.backends[name])

    def _submit(self, tasks: list[Task], backend: Backend) -> None:
        try:
            unit = self._unit(tasks, backend)
            if backend.remote and unit.kind == "gang":
                backend.check(unit)  # its size is known only now (num_parallel computed in the parent step)
            ref = backend.submit(backend.materialize(unit))
        except StokerError as e:  # refused or unreachable: nothing was submitted; no further attempt can help
            for t in tasks:
                t.started, t.backend = time.time(), backend
                m = self._spec(t).manifest_head(t.started).failed(type(e).__name__, str(e),
                                                                  finished_at=time.time()).to_dict()
                write_manifest(self.store, self.causes.refused(m))  # (with its cause: config, or the engine's)
                self._index_ops.append(("ingest", m))
                t.manifest, t.state = m, "failed"
            self.failed = True
            self.failures.append(f"step {tasks[0].step} could not be submitted to {backend.name}: {e}"
                                 + (f"\n  not retried: {FIX_AND_RERUN}" if e.permanent else ""))  # nor resumed
            self._stop_all("another task failed")
            return
        if backend.persist_refs:
            try:
                self.store.write(job_record_name(self.flow, self.run_id, ref), ref.to_json().encode(),
                                 durable=False)
                if self.on_submit:
                    self.on_submit(ref, self.store.url, self.run_id)
            except Exception:
                backend.cancel(ref, 0.0)  # a job nothing could cancel later must not run
                raise
        self.live[(backend.name, ref.job_id)] = (ref, tasks)
        now = time.time()
        host = socket.gethostname()
        for t in tasks:  # readers (the UI, `stoker show`) see the attempt as running until its manifest lands
            self._index_ops.append(("register", dict(flow=self.flow, run_id=self.run_id, step=t.step,
                                                     task_id=t.task_id, attempt=t.attempt, started_at=now,
                                                     user=self.user, hostname=host)))
        if unit.spares:
            self.spares.track(ref, unit, backend.remote)
        for i, t in enumerate(tasks):
            log_dir = os.path.join(self.log_root, self.flow, self.run_id, t.step, f"{t.task_id}.{t.attempt}")
            t.output = TaskOutput(log_dir, self._prefix(t), lazy=True)  # created by the first output
            t.job, t.member, t.backend = ref, unit.first_slots[i] if unit.spares else i, backend
            t.state, t.started, t.deadline, t.stopping, t.stop_reason = "running", 0.0, None, False, None
            self.display.count("running")
        if backend.remote:
            self.display.info(f"[{unit.label}] submitted to {backend.name} as job {ref.job_id}"
                              + (f" ({len(tasks)} {'nodes' if unit.kind == 'gang' else 'tasks'}"
                                 + (f" + {unit.spares} spare{'s' if unit.spares > 1 else ''})" if unit.spares else ")")
                                 if len(tasks) > 1 else ""), style="dim")
        self.last_poll.setdefault(backend.name, now)
        self.poll_gap[backend.name] = min(FAST_POLL_S, backend.poll_interval)

    def _unit(self, tasks: list[Task], backend: Backend) -> Unit:
        kind = "gang" if tasks[0].gang else "array" if len(tasks) > 1 else "task"
        unit = build_unit(self.flow_cls, backend, kind, [self._spec(t) for t in tasks], self.store.url,
                          throttle=self.max_workers if kind == "array" else None)
        self.causes.exclude(unit, backend)  # off the hosts that failed twice, where the engine can choose
        if kind == "gang" and (spares := gang_spares(getattr(self.flow_cls, tasks[0].step))):
            self.spares.prepare(unit, spares, backend.main_node_spare)  # N + k members, generation 0 posted
        if backend.remote:
            if self.ctx.package is None:
                self.ctx.package = stage_package(self.store, self.ctx.flow_file)
            unit.code_key, unit.flow_path = self.ctx.package
            unit.spec_key = self.store.put_bytes(unit.spec_document())
        return unit

    def _clone(self, unit: list[Task]) -> bool:
        """On resume, reuse the origin run's successful task for the same step and foreach position."""
        if not self.origin or unit[0].step in self.rerun_steps:
            return False
        by_id = self.index.by_id
        if not all(by_id[i["task_id"]].cloned for t in unit for i in t.inputs):
            return False  # an input was run again, so this task must run again too
        found = [self.origin.get(t.key) for t in unit]
        if not all(found):
            return False
        for t, m in zip(unit, found, strict=True):
            clone = clone_manifest(m, run_id=self.run_id, task_id=t.task_id, user=self.user,
                                   input_paths=self._spec(t).input_paths())
            write_manifest(self.store, clone)
            self._index_ops.append(("ingest", clone))
            t.manifest, t.state, t.cloned = clone, "ok", True
            self.display.line(t.step, self._prefix(t), f"cloned from {clone['origin_task']}")
            self.display.count("done")
        for t in unit:
            self._successors(t)
            self._settle(t)
        return True

    def _prefix(self, t: Task) -> str:
        return f"{self.run_id}/{t.step}/{t.task_id}" + (f"/attempt {t.attempt}" if t.attempt else "")

    def _spec(self, t: Task) -> TaskSpec:
        return self.ctx.task_spec(step=t.step, task_id=t.task_id, attempt=t.attempt, max_attempts=t.max_attempts,
                                  inputs=t.inputs, foreach=t.foreach, parallel=t.parallel, iteration=list(t.iteration))

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> RunResult:
        old = signal.signal(signal.SIGINT, self._on_sigint)
        old_term = signal.signal(signal.SIGTERM, self._on_sigint)
        try:
            self._add(first_task(self.graph))
            while True:
                self._check_interrupt()
                if not self.failed and not self.interrupted:
                    self._admit()
                self._flush_index()  # one transaction: what the last pass ended, what this one starts (indexed
                for b in self.backends.values():  # before it starts: a task finds itself); then the local fork
                    if isinstance(b, InProcessBackend):  # server forks this pass's members, in one request
                        b.dispatch()
                if not self.live:
                    if self.failed or self.interrupted or not self.index.count("pending"):
                        break
                self._wait(0.05 if self.live else min(0.5, self._next_wakeup()))
                self._check_interrupt()
                self._poll()  # what it ended is indexed with what the next pass starts, in one transaction
                self.display.refresh()
        finally:
            if self._index_ops:  # the run is ending on an error: index what can be indexed
                try:
                    self._flush_index()
                except Exception as e:  # noqa: BLE001 - the error in flight matters more; manifests are the truth
                    log.warning("could not index the last task attempts of run %s: %s", self.run_id, e)
            signal.signal(signal.SIGINT, old)
            signal.signal(signal.SIGTERM, old_term)
            for b in self.backends.values():
                b.close()
            self.display.close()
        status = "killed" if self.interrupted else "failed" if self.failed else "succeeded"
        if status == "succeeded" and not any(t.step == "end" and t.state == "ok" for t in self.tasks):
            status = "failed"
        return RunResult(self.run_id, status, self.failures)

    def _flush_index(self) -> None:
        """Index this pass's starts and ends in one transaction (the store's manifests are the truth). If that
        fails, one at a time: a failed registration is skipped (the index is a view), a failed manifest stops
        the run."""
        ops, self._index_ops = self._index_ops, []
        try:
            if ops:
                self.db.write_batch(ops)
            return
        except Exception:  # noqa: BLE001 - find the one that fails
            pass
        for kind, arg in ops:
            try:
                self.db.write_batch([(kind, arg)])
            except Exception:  # noqa: BLE001 - the run goes on without a registration
                if kind == "ingest":
                    raise

    def _next_wakeup(self) -> float:
        now = time.time()
        due = self.index.next_due(now)
        return max(0.01, due - now) if due is not None else 0.05

    def _on_sigint(self, signum: int, frame: Any) -> None:
        self.hard_stop = self.interrupted  # a second Ctrl-C: kill now, no grace
        self.interrupted = True  # acted on by the loop, never in the middle of a submission

    def _check_interrupt(self) -> None:
        if self.interrupted and not self._stopping:
            self._stopping = True
            self.display.info(f"interrupted: stopping all tasks (up to {KILL_GRACE_S:.0f} s each to save a checkpoint; "
                              "Ctrl-C again to kill them now)", style="bold red")
            self._stop_all("the run was interrupted")
        if self.hard_stop and self._stopping != "hard":
            self._stopping = "hard"
            self.display.info("killing all tasks now", style="bold red")
            for t in list(self.index.in_state["running"].values()):
                t.stopping = False  # stop again, hard
                self._stop(t, "the run was interrupted", hard=True)

    def _live_backends(self) -> list[Backend]:
        names = {name for name, _ in self.live}
        return [b for n, b in self.backends.items() if n in names]

    def _wait(self, seconds: float) -> None:
        """Let the backends stream output until something may have changed or a remote poll is due."""
        live = self._live_backends()
        if not live:
            time.sleep(seconds)
            return
        now = time.time()
        due = min((self.last_poll.get(b.name, 0) + self._gap(b) - now for b in live if b.remote), default=seconds)
        if (spare_due := self.spares.due(now)) is not None:  # a gang with spares' beats, between two polls
            due = min(due, spare_due - now)
        seconds = max(0.0, min(seconds, due)) if any(not b.remote for b in live) else max(0.0, due)
        live.sort(key=lambda b: b.remote)  # a local backend wakes the moment a member exits
        for i, b in enumerate(live):
            b.wait(seconds if i == 0 else 0.0, self._sink)

    def _sink(self, ref: JobRef, member: int, stream: str, data: bytes) -> None:
        _, tasks = self.live.get((ref.backend, ref.job_id), (None, []))
        t = tasks[member] if member < len(tasks) else None
        if t is None or t.member != member:  # a gang with spares: the member runs another node, or none
            t = next((g for g in tasks if g.member == member), None)
        if t is not None and t.output and t.state == "running" and t.job is ref:
            for line in t.output.feed(stream, data):
                self.display.line(t.step, self._prefix(t), line, stream)

    def _poll(self) -> None:
        now = time.time()
        live = self._live_backends()
        due = [b for b in live if b.remote and now - self.last_poll.get(b.name, 0) >= self._gap(b)]
        if due and not self.interrupted:  # before the statuses: a job `stoker kill` cancelled is not retried
            if self.store.exists(kill_request_name(self.flow, self.run_id)):  # `stoker kill` from anywhere
                self.display.info("stoker kill: stopping all tasks", style="bold red")
                self.interrupted = True
                return
        for b in live:
            if now - self.last_poll.get(b.name, 0) < self._gap(b):
                continue
            self.last_poll[b.name] = now
            refs = [ref for (n, _), (ref, _) in self.live.items() if n == b.name]
            before = self._states(b, refs)
            try:
                statuses = b.poll(refs)
            except StokerError as e:  # a controller restart or a network blip must not end a days-long run
                self.display.info(f"{b.name}: could not poll ({e}); trying again", style="yellow")
                statuses = {}
            for ref in refs:
                self._update(b, ref, statuses.get(ref.job_id), now)
            changed = before != self._states(b, refs)
            self.poll_gap[b.name] = min(FAST_POLL_S, b.poll_interval) if changed else \
                min(b.poll_interval, 2 * self._gap(b))
        if not self.interrupted:
            self.spares.recheck(time.time())

    def _states(self, b: Backend, refs: list[JobRef]) -> list[tuple]:
        return [(t.state, bool(t.started)) for r in refs for t in self.live.get((b.name, r.job_id), (r, []))[1]]

    def _gap(self, b: Backend) -> float:
        return self.poll_gap.get(b.name, b.poll_interval)

    def _update(self, b: Backend, ref: JobRef, status: JobStatus | None, now: float) -> None:
        key = (b.name, ref.job_id)
        tasks = self.live[key][1]
        if status is None:  # not (yet, or any more) known to the engine, or the engine did not answer
            since = self.unseen.setdefault(key, now)
            if now - since < LOST_AFTER_S and not (self.stop_deadline and now > self.stop_deadline):
                return
            status = JobStatus(EXITED, exit_code=-9, reason=f"the {b.name} engine lost job {ref.job_id}")
        self.unseen.pop(key, None)
        if ref.job_id in self.spares.gangs:  # a gang with spares: a lost node's slot goes to a spare
            self.spares.check(ref, tasks, status, now)
        if ref.kind == "gang" and b.remote:  # a node whose heartbeat stopped: its gang is stopped now
            watch_gang(self, ref, tasks, status, now)  # (runtime/driver/lostnodes.py)
        mine = [i for i, t in enumerate(tasks) if t.state == "running" and t.job is ref]  # not a later attempt's
        ended = {i: self._ended_at(tasks[i]) for i in mine if status.member(tasks[i].member).state == EXITED}
        # a gang whose nodes all ended together: the node that reported its own failure first went first; of those
        # that wrote nothing, one that died (say by SIGKILL) before those the engine TERMinated after it (srun's
        # --kill-on-bad-exit)
        for i in sorted(mine, key=lambda i: (i not in ended, ended.get(i) is None, ended.get(i) or 0,
                                             signal_of(status.member(tasks[i].member).exit_code) == signal.SIGTERM, i)):
            t, s = tasks[i], status.member(tasks[i].member)
            if s.state == EXITED:
                self._finish(t, s.exit_code if s.exit_code is not None else -9, s.reason)
            elif s.started_at or s.state != "queued":
                if not t.started:
                    t.started = s.started_at or now
                    limit = deadline(getattr(self.flow_cls, t.step))  # the task stops itself first
                    t.deadline = t.started + limit[0] + 5 if limit else None
                if t.deadline and now > t.deadline and not t.stopping:
                    self._stop(t, deadline(getattr(self.flow_cls, t.step))[1], hard=True)
            elif s.blocked and not t.stopping:
                self._stop(t, f"{NEVER_STARTS} ({s.reason})", hard=True)
            elif s.reason and s.reason != t.queued_reason and not t.stopping:
                t.queued_reason = s.reason
                if i == 0 or ref.kind != "array":
                    self.display.info(f"[{self._prefix(t)}] waiting in the {b.name} queue: {s.reason}", style="dim")
        if ref.kind == "gang":
            self.display.gang(key, f"{self.run_id}/{tasks[0].step}", node_states(tasks, ref, status), now)
        if self.stop_deadline and now > self.stop_deadline:
            for t in tasks:
                if t.state == "running" and t.job is ref:
                    self.failures.append(f"could not confirm that {b.name} job {ref.job_id} ({t.step}/{t.task_id})"
                                         f" was cancelled: cancel it by hand")
                    self._finish(t, -9, "its cancellation was not confirmed")
        if not any(t.state == "running" and t.job is ref for t in tasks):
            del self.live[key]
            self.spares.over(ref, tasks)
            if b.persist_refs:  # the backend may have added what it learned (start and stop times, for the cost)
                try:
                    self.store.write(job_record_name(self.flow, self.run_id, ref), ref.to_json().encode(),
                                     durable=False)
                except Exception:  # noqa: BLE001 - the record from the submission stays
                    pass

    def _ended_at(self, t: Task) -> float | None:
        """When a remote task wrote its own manifest (None: it did not; it was killed)."""
        if not t.backend.remote:
            return None
        m, _ = manifest_outcome(self.store, manifest_name(self.flow, self.run_id, t.step, t.task_id, t.attempt))
        return m.get("finished_at") if m else None

    def _stop(self, t: Task, reason: str, hard: bool = False) -> None:
        if t.state != "running" or t.stopping:
            return  # not running, or already being stopped
        grace = 0.0 if hard else KILL_GRACE_S
        if t.job.kind == "array":  # its siblings are independent tasks
            t.stop_reason, t.stopping = t.stop_reason or reason, True
            t.backend.cancel(t.job, grace, member=t.member)
        else:
            for g in self.live.get((t.backend.name, t.job.job_id), (t.job, [t]))[1]:
                if g.state == "running" and not g.stopping and g.job is t.job:
                    g.stop_reason, g.stopping = g.stop_reason or reason, True
            t.backend.cancel(t.job, grace)
        if t.backend.remote and self.stop_deadline is None and (self.failed or self.interrupted):
            self.stop_deadline = time.time() + CANCEL_WAIT_S

    def _stop_all(self, reason: str) -> None:
        for t in list(self.index.in_state["running"].values()):  # only a running task can be stopped
            self._stop(t, reason)

    # -- outcomes ---------------------------------------------------------------------------------
    def _finish(self, t: Task, code: int, reason: str | None = None) -> None:
        if not t.backend.remote:
            self.pool.give(node_need(self.flow_cls, t.step))
        self.display.count("running", -1)
        t.exit_code = code
        t.engine_reason = reason
        m, untrusted = self._outcome(t)
        if m is None and code != 0 and not untrusted:  # it died: its log (and the console) says how
            cut = b"\n" if t.output.partial["stderr"] else b""  # on its own line, after what it printed last
            for line in t.output.feed("stderr", cut + crash_note(code, t.stop_reason or reason).encode()):
                self.display.line(t.step, self._prefix(t), line, "stderr")
        for stream, line in t.output.close():
            self.display.line(t.step, self._prefix(t), line, stream)
        store_logs(self.store, t, lambda stream: log_name(self.flow, self.run_id, t.step, t.task_id, t.attempt, stream))
        if t.backend.remote and m and m.get("status") == "ok":
            code = 0  # a remote node's exit code is often its job's (srun's): its own manifest is the truth
        if code == 0 and m and m.get("status") == "ok":
            t.manifest, t.state = m, "ok"
            self._index_ops.append(("ingest", m))
            self.display.count("done")
            if t.gang and not all(g.state == "ok" for g in self._gang(t)):
                if t.gang in self.gang_failures:  # another node failed first: this one ended well before its stop
                    self._gang_failed(t)  # came, and may be the last: the gang is retried or fails now
                return
            for g in self._gang(t) if t.gang else [t]:
                self._successors(g)
                self._settle(g)
            return
        if m and m.get("status") == "failed" and t.engine_reason and m.get("exception"):
            # e.g. the task saw its workers die, and Slurm knows why: out of memory
            m = Manifest.from_dict(m).with_reason(f"{t.backend.name}: {t.engine_reason}").to_dict()
            write_manifest(self.store, m)
        m = m or self._failure_manifest(t, code, untrusted)
        if m.get("status") == "ok":
            m = Manifest.from_dict(m).failed("ExitCode", f"exit code {code}").to_dict()
            write_manifest(self.store, m)
        m = self.causes.record(t, m)  # its cause and evidence (runtime/driver/attribution.py)
        self._index_ops.append(("ingest", m))
        own = t.stop_reason and t.stop_reason.startswith(("it exceeded", NEVER_STARTS))  # its own fault
        t.manifest, t.state = m, ("killed" if t.stop_reason and not own else "failed")
        if t.gang:
            self._gang_failed(t)
        else:
            self._again_or_fail([t])

    def _outcome(self, t: Task) -> tuple[dict | None, str | None]:
        """The attempt's manifest as its member handed it over (a local member: no read, no signature check),
        else as the store has it (see manifest_outcome)."""
        data = t.backend.handed(t.job, t.member) if isinstance(t.backend, InProcessBackend) else None
        m = (handed_manifest(data, self.store.url, self.flow, self.run_id, t.step, t.task_id, t.attempt)
             if data else None)
        if m is not None:
            return m, None
        return manifest_outcome(self.store, manifest_name(self.flow, self.run_id, t.step, t.task_id, t.attempt))

    @staticmethod
    def _settle(t: Task) -> None:
        """Drop what an ok task's successors no longer need (its manifest, ~8 KB parsed, stays in the store and the
        index): the run keeps every task, and each fork costs time in proportion to the scheduler's memory."""
        t.manifest = {"status": t.manifest["status"]} if t.manifest else t.manifest
        t.output = t.job = None  # (only a running task's job is ever looked at)

    def _failure_manifest(self, t: Task, code: int, untrusted: str | None = None) -> dict:
        how = died_how(code)
        why = t.stop_reason or t.engine_reason
        why = f" because {why}" if why else ""
        message = f"its manifest cannot be trusted: {untrusted}" if untrusted else f"task process {how}{why}"
        m = self._spec(t).manifest_head(t.started).failed("UntrustedManifest" if untrusted else "TaskDied", message,
                                                          finished_at=time.time()).to_dict()
        write_manifest(self.store, m)
        return m

    def _gang(self, t: Task) -> list[Task]:
        return self.index.by_gang[t.gang]

    def _gang_failed(self, t: Task) -> None:
        gang_failed(self, t)  # the others stopped, then the gang retried or failed as one (runtime/driver/lostnodes.py)

    def _why(self, t: Task) -> str:
        exc = (t.manifest or {}).get("exception") or {}
        return f"{exc.get('type', '?')}: {exc.get('message', '')}".strip()

    def _again_or_fail(self, unit: list[Task], first: Task | None = None) -> None:
        """Another attempt of the unit (the step's own, a preemption's, an infrastructure failure's, or a fallback),
        or the run fails. The attempt's cause decides (runtime/driver/attribution.py): a deterministic one is not
        retried."""
        first = first or unit[0]
        if self.interrupted or first.stop_reason in ("another task failed", "the run was interrupted"):
            return
        cause = self.causes.unit_cause(unit, first)
        stop = None if self.failed else self.causes.verdict(unit, first, cause)  # "not retried: ..." or None
        never = (first.stop_reason or "").startswith(NEVER_STARTS) or stop is not None
        note = None
        if not self.failed and not never:
            note = requeue_preempted(unit, first) if cause.kind == PREEMPTION else \
                self.causes.free_attempt(unit, first, cause)
        fallback = "" if self.failed or never else \
            fallback_note(self.flow_cls, self.graph[first.step].kind, unit, first)
        if (first.attempt + 1 < first.max_attempts or fallback) and not self.failed and not never:
            at_once = note or fallback or not self._backend(first.step).remote  # Metaflow retries local at once
            delay = 0 if at_once else attempt_delay_s(getattr(self.flow_cls, first.step))
            why = f"{self._why(first)}; {cause.label}"
            self.display.info(f"[{self._prefix(first)}] {note}" if note else
                              f"[{self._prefix(first)}] failed ({why}); {fallback}" if fallback else
                              f"[{self._prefix(first)}] failed ({why}); "
                              f"{'the gang ' if first.gang else ''}retry {first.attempt + 1} of "
                              f"{first.max_attempts - 1}" + (f" in {delay:.0f} s" if delay else ""),
                              style="yellow")
            excluded = self.causes.blame(unit, first, cause)  # a host that failed twice: avoided from now on
            if excluded:
                self.display.info(f"[{self._prefix(first)}] {excluded}", style="yellow")
            for g in unit:
                g.attempt += 1
                g.state, g.not_before, g.manifest, g.job = "pending", time.time() + delay, None, None
            return
        self.failed = True
        self.display.count("failed")
        tail = "\n    ".join(list(first.output.tail)[-15:]) if first.output and cause.kind != CONFIG else ""
        msg = (f"step {first.step} (task {self.flow}/{self.run_id}/{first.step}/{first.task_id}"
               + (f", gang node {first.parallel.node_index}" if first.parallel else "")
               + f") failed after {first.attempt + 1} attempt(s): {self._why(first)}"
               + f"\n  cause: {cause.line()}" + (f"\n  not retried: {stop}" if stop else ""))
        self.failures.append(msg + (f"\n  last lines of its log:\n    {tail}" if tail else ""))
        self._stop_all("another task failed")
