"""The local backend: each member is a process on this machine, forked by a small fork server that the
scheduler forks at the first member (forkserver.py; the default), forked from the (single-threaded) scheduler
itself (STOKER_TASK_LAUNCH=fork), or spawned as `python flow.py _task SPEC.json` (STOKER_TASK_LAUNCH=subprocess,
or where fork is unavailable).

Forking skips interpreter start-up and re-importing the flow (a few ms a task instead of ~0.3 s); each member is
still its own process, in its own session so that a stop reaches torchrun and its workers too, and dies with
the scheduler (PR_SET_PDEATHSIG) so that a killed `run` leaves no orphans behind. Pipes and pidfds live here:
`wait()` streams output to the scheduler and wakes it the moment a member exits. The members one scheduler pass
submits are forked together (`dispatch()`: one request to the fork server), and each forked member hands the
manifest it stored to the scheduler on a socket only the run holds (runtime/member/handover.py, `handed()`), so the
scheduler neither reads it back nor parses its signature.
"""

from __future__ import annotations

import itertools
import os
import random
import selectors
import shlex
import signal
import socket
import sys
import time
from collections.abc import Callable

from stoker._process import _PARENT_ONLY_FDS, Reaper, kill_grace, unsafe_to_fork
from stoker.backends.local import forkserver
from stoker.backends.local.process import Member, fork_child, fork_member, server_members, spawn_member
from stoker.errors import ConfigError
from stoker.runtime.contract import (
    EXITED,
    RUNNING,
    Capabilities,
    InProcessBackend,
    JobRef,
    JobStatus,
    Request,
    Sink,
    Unit,
)
from stoker.runtime.member import handover
from stoker.runtime.spec import TaskSpec


def free_port(span: int = 2) -> int:
    """A rendezvous port P for a local gang with P .. P+span-1 free (the preflight's all_reduce meets on P+1, a gang
    with spares' generation g on P+1+g), below the kernel's ephemeral range: outbound connections take ports from
    that range at any moment, so one picked there (as binding to port 0 does) can be taken before torchrun listens
    on it (EADDRINUSE, seen in CI)."""
    low = _ephemeral_low()
    for _ in range(64):
        port = random.randrange(max(1024, low - 16000), low - span)
        if all(_bindable(port + i) for i in range(span)):
            return port
    with socket.socket() as s:  # a crowded host: what the kernel gives
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return max(4096, int(f.read().split()[0]))
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))  # where torchrun's store listens: every address
            return True
        except OSError:
            return False


class _Job:
    def __init__(self, ref: JobRef, members: list[Member]) -> None:
        self.ref, self.members = ref, members
        self.kill_at: float | None = None


class LocalBackend(InProcessBackend):
    name = "local"
    remote = False
    persist_refs = False  # members die with the scheduler
    poll_interval = 0.0

    def __init__(self, flow_file: str = "", mode: str | None = None) -> None:
        self.flow_file = flow_file
        mode = mode or os.environ.get("STOKER_TASK_LAUNCH", "forkserver")
        if mode == "forkserver":
            self.mode = "forkserver" if forkserver.available() else "fork" if hasattr(os, "fork") else "subprocess"
        else:
            self.mode = "fork" if mode == "fork" and hasattr(os, "fork") else "subprocess"
        self.server: forkserver.ForkServer | None = None  # mode forkserver: started at the first member
        self.entry: Callable[[TaskSpec], int] | None = None  # runs a task in a forked child
        self.preload: Callable[[], None] | None = None  # the imports every task makes, made before forking
        self.jobs: dict[str, _Job] = {}
        self.sel = selectors.DefaultSelector()
        self._ids = itertools.count(1)
        self._sink: Sink = lambda *a: None
        self.reaper: Reaper | None = None  # kills members that outlive a crashed run (started at the first submit)
        self.results: socket.socket | None = None  # forked members hand their manifests over on it (handover.py)
        self.results_fd = -1  # its members' end
        self.handed_over: dict[int, bytes] = {}  # member pid -> the manifest it handed over, until asked for
        self.succeeded: set[int] = set()  # members that handed over a success: done, though still exiting
        self.lingering: list[tuple[_Job, int]] = []  # such members, until they exit (then reaped: _sweep)
        self._starting: list[tuple[_Job, dict, dict[str, str]]] = []  # submitted, forked at the next _start()
        self._owner: dict[int, tuple[_Job, int]] = {}  # a watched pipe or pidfd -> its member (job, index)

    def bind(self, entry: Callable[[TaskSpec], int], preload: Callable[[], None] | None = None) -> None:
        """The in-process task entrypoint a forked member calls (the scheduler's flow class, store, graph), and
        what to import before forking members (once in the fork server, not once per member)."""
        self.entry, self.preload = entry, preload

    def start_early(self) -> None:
        """Start the run's reaper and fork server now rather than at the first member (a run calls it once its
        flow class, store and graph are final): their start-up (the server's ``preload``) then runs on another
        core while the scheduler registers the run and plans its first pass, instead of before the first task.
        A no-op in the other modes, unbound, or once started; ``close()`` stops both as always."""
        if self.mode != "forkserver" or self.entry is None or self.server is not None or not self._forkable():
            return
        if self.reaper is None:  # first, as at a first submit: the server closes the run's end of its pipe
            self.reaper = Reaper(kill_grace())
        if self.results is None:
            self._open_results()  # before the server, which inherits the members' end
        self._server()

    def _forkable(self) -> bool:
        """Whether this process may still fork members (docs/fork-safety.md): not once CUDA is initialized or a
        device runtime imported here (by the flow's module code); its members then start as new processes."""
        if why := unsafe_to_fork():
            print(f"stoker: {why} in the run's process: tasks start as new processes (a forked one could not use "
                  "it); move that code into a step to keep forking", file=sys.stderr)
            self.mode = "subprocess"
            return False
        return True

    def capabilities(self) -> Capabilities:
        from stoker.monitor.host import local_gpu_count

        memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
        return Capabilities(multi_node=True, gpus=local_gpu_count(), cpus=os.cpu_count() or 1, memory_mb=memory_mb,
                            notes=["gang nodes share this machine; rendezvous on 127.0.0.1"])

    # -- the contract ---------------------------------------------------------------------------------
    def materialize(self, unit: Unit) -> Request:
        lines = [f"# {unit.label}: {unit.size} local process(es), {self.mode}"
                 + (f", and {unit.spares} spare(s) waiting to take a lost node's place" if unit.spares else "")]
        for i, spec in enumerate(unit.specs):
            env = {**unit.env, **self._member_env(unit, i, port=None)}
            lines.append(" ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
                         + f" {shlex.quote(sys.executable)} {shlex.quote(self.flow_file)} _task <spec of task "
                         f"{spec.task_id}>")
        return Request(self.name, unit, "\n".join(lines) + "\n")

    def _member_env(self, unit: Unit, i: int, port: int | None) -> dict[str, str]:
        env = {"STOKER_MEMBER": str(i), "STOKER_NUM_NODES": str(unit.nodes if unit.kind == "gang" else 1),
               "STOKER_MAIN_ADDR": "127.0.0.1"}
        if port is not None:
            env["STOKER_MAIN_PORT"] = str(port)
        return env

    def submit(self, request: Request) -> JobRef:
        unit = request.unit
        port = free_port(2 + unit.spares) if unit.kind == "gang" else None  # fresh per attempt: stragglers may hold
        # the last
        doc = {"kind": unit.kind, "specs": list(unit.specs)}  # the specs themselves: no JSON on this machine
        if unit.spares:  # a gang with hot spares: its spares are members too (runtime/member/standby.py)
            if self.mode == "subprocess":
                raise ConfigError("@torchrun(spares=...) runs local spares as forked processes: unset "
                                  "STOKER_TASK_LAUNCH=subprocess, or drop spares")
            doc.update(spares=unit.spares, first_slots=unit.first_slots)
        if self.reaper is None and self.mode != "subprocess":  # the first submit: the run's code has all run
            self._forkable()
        if self.results is None and self.mode != "subprocess" and self.entry is not None:
            self._open_results()
        if self.reaper is None:
            self.reaper = Reaper(kill_grace())
        ref = JobRef(self.name, f"local-{next(self._ids)}", members=unit.nodes, kind=unit.kind, step=unit.step,
                     task_ids=[s.task_id for s in unit.specs], attempt=unit.attempt, extra={"pids": []})
        job = _Job(ref, [])
        self.jobs[ref.job_id] = job
        envs = [{**unit.env, **self._member_env(unit, i, port)} for i in range(unit.nodes)]
        if self.mode == "forkserver" and self.entry is not None:  # forked with the rest of this pass's (_start)
            self._starting += [(job, doc, env) for env in envs]
            return ref
        for env in envs:
            if self.mode == "fork" and self.entry is not None:
                self._started(job, fork_member(env, lambda entry=self.entry: entry(member_spec(doc))))
            else:
                self._started(job, spawn_member(self.flow_file, member_spec(doc, env), env))
        return ref

    def dispatch(self) -> None:
        self._start()

    def _start(self) -> None:
        """Fork the members submitted since the last call, in one request to the fork server (the scheduler's
        dispatch() after a pass; also before anything looks at members: wait, poll, cancel, logs, handed)."""
        if not self._starting:
            return
        starting, self._starting = self._starting, []
        for (job, _, _), m in zip(starting, server_members(self._server(), [(doc, env) for _, doc, env in starting]),
                                  strict=True):
            self._started(job, m)

    def _started(self, job: _Job, m: Member) -> None:
        i = len(job.members)
        job.members.append(m)
        job.ref.extra["pids"].append(m.pid)
        self.reaper.watch(m.pid)  # type: ignore[union-attr]
        for fd, stream in zip(m.fds, ("stdout", "stderr"), strict=False):
            self._watch(fd, job, i, stream)
        if m.exit_fd is not None:
            self._watch(m.exit_fd, job, i, "exit")

    def poll(self, refs: list[JobRef]) -> dict[str, JobStatus]:
        self._start()
        if self.lingering:
            self._sweep()
        out: dict[str, JobStatus] = {}
        now = time.time()
        for ref in refs:
            job = self.jobs.get(ref.job_id)
            if job is None:
                continue
            if job.kill_at is not None and now >= job.kill_at:
                for m in job.members:
                    if m.poll() is None and not m.early:
                        m.signal(signal.SIGKILL)
            members: dict[int, JobStatus] = {}
            for i, m in enumerate(job.members):
                code = m.poll()
                if code is None and (m.early or m.pid in self.succeeded):
                    if not m.early:
                        self._let_go(job, i)
                    code = 0  # its manifest, stored, says ok: what follows need not wait for its exit
                if code is None:
                    members[i] = JobStatus(RUNNING, started_at=m.started)
                    continue
                if not m.reaped and not m.early:
                    m.signal(signal.SIGKILL, tree=False)  # stragglers left in its process group
                    self._drain(job, i)
                    m.reaped = True
                members[i] = JobStatus(EXITED, exit_code=code, started_at=m.started, hosts=["localhost"])
            done = all(s.state == EXITED for s in members.values())
            code = next((s.exit_code for s in members.values() if s.exit_code), 0) if done else None
            out[ref.job_id] = JobStatus(EXITED if done else RUNNING, exit_code=code, started_at=ref.submitted_at,
                                        hosts=["localhost"], members=members)
            if done:
                del self.jobs[ref.job_id]
        return out

    def _let_go(self, job: _Job, i: int) -> None:
        """Member i handed over a success and now only cleans up and exits: take what it printed (it flushed its
        output before handing over, so all of it is in its pipes) and reap it once it has exited (_sweep)."""
        m = job.members[i]
        self.succeeded.discard(m.pid)
        m.early = True
        for fd, stream in zip(m.fds, ("stdout", "stderr"), strict=False):
            while self._owns(fd, job, i):
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    break
                except OSError:
                    data = b""
                if not data:
                    self._close(fd)
                    break
                m.keep(stream, data)
                self._sink(job.ref, i, stream, data)
        self.lingering.append((job, i))

    def _sweep(self) -> None:
        """Reap the members let go early that have exited (stragglers left in their process group killed)."""
        for job, i in list(self.lingering):
            m = job.members[i]
            if m.poll() is None:
                continue
            self.lingering.remove((job, i))
            m.signal(signal.SIGKILL, tree=False)
            self._drain(job, i)
            m.reaped = True

    def handed(self, ref: JobRef, member: int) -> bytes | None:
        self._start()
        job_pids = (ref.extra or {}).get("pids") or []
        if member >= len(job_pids) or self.results is None:
            return None
        handover.receive(self.results, self.handed_over, self.succeeded)  # sent before the member exited
        return self.handed_over.pop(job_pids[member], None)

    def cancel(self, ref: JobRef, grace: float = 3.0, member: int | None = None) -> None:
        self._start()  # (a member not yet forked is forked and stopped: it never runs far)
        job = self.jobs.get(ref.job_id)
        # already stopping; grace 0 (a second Ctrl-C) kills now
        if job is None or (job.kill_at is not None and grace > 0):
            return
        for m in job.members if member is None else job.members[member:member + 1]:
            if m.poll() is None and not m.early:  # (one let go early has succeeded: it is only exiting)
                m.signal(signal.SIGKILL if grace <= 0 else signal.SIGTERM)
        job.kill_at = time.time() + max(0.0, grace)

    def logs(self, ref: JobRef, member: int = 0, stream: str = "stdout") -> bytes:
        self._start()
        job = self.jobs.get(ref.job_id)
        return bytes(job.members[member].tail[stream]) if job else b""

    def wait(self, timeout: float, sink: Sink) -> None:
        self._start()
        self._sink = sink
        if self.reaper is not None:
            self.reaper.flush()  # the members this pass started, in one write
        if not self.sel.get_map():
            time.sleep(timeout)
            return
        for key, _ in self.sel.select(timeout):
            job, i, stream = key.data
            if stream == "result":  # finished members' manifests: the scheduler asks for them (handed())
                handover.receive(self.results, self.handed_over, self.succeeded)  # type: ignore[arg-type]
            elif stream == "server":  # members' exit codes: poll() collects them
                self.server.pump()  # type: ignore[union-attr]
                if not self.server.alive:  # type: ignore[union-attr]
                    self.sel.unregister(key.fd)  # its members are reported exited (code 1) from now on
            elif stream == "exit":  # a member exited: stop watching; poll() collects it right away
                self._close(key.fd)
                job.members[i].exit_fd = None
            else:
                self._read(job, i, stream, key.fd)

    def close(self) -> None:
        self._starting = []  # never forked: nothing to stop
        self._let_exit(5.0)
        if self.reaper is not None:
            self.reaper.done(wait=False)  # it exits while the fork server does (waited for below)
        if self.server is not None:
            if self.server.fileno() in self.sel.get_map():
                self.sel.unregister(self.server.fileno())
            self.server.close()
            self.server = None
        if self.results is not None:
            self.sel.unregister(self.results.fileno())
            _PARENT_ONLY_FDS.discard(self.results.fileno())
            self.results.close()
            os.close(self.results_fd)
            self.results, self.results_fd = None, -1
            handover.offer(-1)
        for fd in list(self.sel.get_map()):
            self._close(fd)
        self.sel.close()
        if self.reaper is not None:
            self.reaper.join(timeout=0)  # told "done" above: it exits by itself
            self.reaper = None

    def _let_exit(self, timeout: float) -> None:
        """Wait for the members let go early to exit (they are cleaning up: their temp folders), then stop any
        that did not within `timeout`."""
        deadline = time.time() + timeout
        while self.lingering and time.time() < deadline:
            self.wait(0.05, self._sink)  # their exits (the fork server's reports, pidfds) wake it
            self._sweep()
        for job, i in self.lingering:
            job.members[i].signal(signal.SIGKILL)
        self.lingering = []

    def _open_results(self) -> None:
        """The socket forked members hand their manifests over on: made before the fork server, which inherits
        the members' end (so do members forked here); the scheduler's end is closed in every child."""
        self.results, self.results_fd = handover.channel()
        _PARENT_ONLY_FDS.add(self.results.fileno())
        handover.offer(self.results_fd)
        self.sel.register(self.results.fileno(), selectors.EVENT_READ, (None, 0, "result"))

    def _server(self) -> forkserver.ForkServer:
        """The fork server, started at the first member (while the scheduler is still small)."""
        if self.server is None:
            entry = self.entry

            def run_member(doc: dict, env: dict[str, str], environ: dict[str, str], w_fds: tuple[int, int]) -> int:
                return fork_child(env, lambda: entry(member_spec(doc)), w_fds, environ=environ)  # type: ignore[misc]

            preload = self.preload

            def preload_all() -> None:
                import stoker.runtime.member.node  # noqa: F401  (member_spec: each member's first call)

                if preload is not None:
                    preload()

            self.server = forkserver.ForkServer(run_member, preload_all)
            self.sel.register(self.server.fileno(), selectors.EVENT_READ, (None, 0, "server"))
        return self.server

    # -- output ------------------------------------------------------------------------------------------
    def _watch(self, fd: int, job: _Job, i: int, stream: str) -> None:
        self.sel.register(fd, selectors.EVENT_READ, (job, i, stream))
        self._owner[fd] = (job, i)

    def _close(self, fd: int) -> None:
        self.sel.unregister(fd)
        self._owner.pop(fd, None)
        os.close(fd)

    def _read(self, job: _Job, i: int, stream: str, fd: int) -> bool:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return True
        except OSError:
            data = b""
        if not data:
            self._close(fd)
            return False
        job.members[i].keep(stream, data)
        self._sink(job.ref, i, stream, data)
        return True

    def _drain(self, job: _Job, i: int) -> None:
        """Read what an exited member left in its pipes (a straggler may hold one open: give up after 1 s)."""
        import select

        m = job.members[i]
        if m.exit_fd is not None:
            if self._owns(m.exit_fd, job, i):
                self._close(m.exit_fd)
            m.exit_fd = None
        for fd, stream in zip(m.fds, ("stdout", "stderr"), strict=False):
            deadline = time.time() + 1.0
            while self._owns(fd, job, i) and time.time() < deadline:
                ready, _, _ = select.select([fd], [], [], 0.1)
                if not ready or not self._read(job, i, stream, fd):
                    break
            if self._owns(fd, job, i):
                self._close(fd)

    def _owns(self, fd: int, job: _Job, i: int) -> bool:
        """Whether ``fd`` is still member i's: a pipe closed at its end of file frees its number, which the next
        member's pipe or pidfd may get (draining that one here would steal its output and close it)."""
        owner = self._owner.get(fd)
        return owner is not None and owner[0] is job and owner[1] == i


def member_spec(doc: dict, env: dict[str, str] | None = None) -> TaskSpec:
    """runtime/member/node.member_spec, imported on first use (the node agent's module: ~5 ms of every run's start
    that a run whose members the fork server starts never needs here; the server preloads it)."""
    from stoker.runtime.member.node import member_spec as spec_of

    return spec_of(doc, env)

