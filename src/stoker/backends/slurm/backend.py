"""The Slurm backend: one sbatch job per unit (a gang is one `--nodes=N` job, a foreach can be one array).

Members write their output to per-node files in the unit's log folder (render.py); `logs()` reads them and
`wait()` tails them for live output, so the folder must be on a filesystem the nodes and this host share,
as must a local-folder store. `check()` refuses, before anything is submitted, what cannot work.

Every gang member leaves its exit code in the log folder (node.py): a gang's job reports srun's, one for all nodes.
A gang with k spares is one `--no-kill` job of N + k members (render.py): a member that ended is reported by the exit
code it left, a node Slurm removes from the job as that member's loss
(states.spare_members), and member 0, the batch host whose loss kills the batch script and srun, is the last spare
(`main_node_spare`). If it is lost all the same, the job would hold its other nodes until its time limit: once no
member step is left, it is cancelled and reported ended (the members' manifests say how each did).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from stoker.backends.slurm.client import Partition, SlurmClient
from stoker.backends.slurm.decorator import mem_to_mb, time_to_minutes
from stoker.backends.slurm.render import (
    SlurmOptions,
    batch_log,
    effective_options,
    log_folder,
    member_exit,
    member_log,
    render_sbatch,
)
from stoker.backends.slurm.states import job_status, spare_members
from stoker.errors import BackendError, ConfigError
from stoker.runtime.contract import (
    EXITED,
    QUEUED,
    RUNNING,
    Backend,
    Capabilities,
    JobRef,
    JobStatus,
    Request,
    Sink,
    Unit,
)

log = logging.getLogger(__name__)
SHARED_FIX = ("put STOKER_HOME on the shared filesystem, declare a shared path with STOKER_SHARED_PATHS "
              "(os.pathsep-separated), or use an s3:// store")


def shared_reason(path: str, env: dict[str, str] | None = None) -> str | None:
    """None when the cluster's nodes can see `path`, else why not (for the error message)."""
    real = os.path.realpath(os.path.expanduser(path))
    declared = [p for p in (env if env is not None else os.environ).get("STOKER_SHARED_PATHS", "").split(os.pathsep)
                if p.strip()]
    for p in declared:
        root = os.path.realpath(os.path.expanduser(p)).rstrip("/")
        if real == root or real.startswith(root + "/"):
            return None
    from stoker.store.fsinfo import is_network_fs

    if is_network_fs(real):
        return None
    where = f"STOKER_SHARED_PATHS={os.pathsep.join(declared)}" if declared else "STOKER_SHARED_PATHS is not set"
    return f"{real} is on a local filesystem of this host and not under a declared shared path ({where})"


class _Tail:
    """Read offsets of one job's log files, so `wait()` feeds only new, whole lines to the sink. Only members
    that have started are read; a member that has ended is read to its end once, then left alone."""

    def __init__(self, ref: JobRef) -> None:
        self.ref = ref
        self.offsets: dict[str, int] = {}
        self.status: JobStatus | None = None
        self.done: set[int] = set()

    @property
    def over(self) -> bool:
        return len(self.done) >= self.ref.members

    def _files(self, member: int) -> list[tuple[str, str]]:
        folder, out = self.ref.extra.get("log_dir", ""), []
        for stream in ("stdout", "stderr"):
            out.append((stream, member_log(folder, self.ref.job_id, member, stream)))
            b = batch_log(folder, self.ref.job_id, member, self.ref.kind, stream)
            if b:
                out.append((stream, b))
        return out

    def feed(self, sink: Sink) -> None:
        if self.status is None:
            return
        for member in range(self.ref.members):
            state = self.status.member(member).state
            if member in self.done or state == QUEUED:
                continue
            for stream, path in self._files(member):
                self._read(sink, member, stream, path, final=state == EXITED)
            if state == EXITED:
                self.done.add(member)

    def _read(self, sink: Sink, member: int, stream: str, path: str, final: bool) -> None:
        start = self.offsets.get(path, 0)
        try:
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read()
        except OSError:
            return
        if not final:
            data = data[: data.rfind(b"\n") + 1]  # whole lines only while the member runs
        if data:
            self.offsets[path] = start + len(data)
            sink(self.ref, member, stream, data)


class SlurmBackend(Backend):
    """Runs units as Slurm jobs (see the module docstring). Every argument is optional."""

    name = "slurm"
    remote = True
    arrays = True
    persist_refs = True
    excludes_hosts = True  # a retry can avoid the hosts that failed (sbatch --exclude)
    # a gang with spares keeps member 0, the batch host, as its last spare: losing it kills the batch script and
    # srun (measured with Slurm 22.05: the job then never ends by itself), losing any other node only removes it
    main_node_spare = True
    spares_sweep_s = 5.0  # at the run's end, how long a gang with spares still running may take to end by itself

    def __init__(self, options: SlurmOptions | None = None, client: SlurmClient | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.options = options or SlurmOptions()
        self.client = client or SlurmClient()
        self.poll_interval = self.options.poll_interval
        self.sleep = sleep
        self._partitions: dict[str, Partition] | None = None
        self._tails: dict[str, _Tail] = {}
        self._cancelled: set[str] = set()
        self._force_at: dict[str, float] = {}  # job id -> when to cancel it for good (after the grace)
        self._headless: dict[str, JobStatus] = {}  # gangs with spares that lost their batch host and were ended
        self._running_spares: dict[str, JobRef] = {}  # gangs with spares not seen ended yet (close() sweeps them)

    # -- before submitting ----------------------------------------------------------------------------
    def partitions(self) -> dict[str, Partition]:
        """The cluster's partitions (one sinfo call per backend instance)."""
        if self._partitions is None:
            self._partitions = self.client.sinfo()
        return self._partitions

    def capabilities(self) -> Capabilities:
        parts = list(self.partitions().values())
        return Capabilities(multi_node=True, gpus=max((p.gpus for p in parts), default=0),
                            cpus=max((p.cpus for p in parts), default=0),
                            memory_mb=max((p.memory_mb for p in parts), default=0),
                            notes=[f"partition {p.name}: {p.nodes} nodes" for p in parts])

    def check(self, unit: Unit) -> None:
        where = f"step {unit.step!r} (@slurm)"
        store = unit.store_url or _default_store()
        if "://" not in store or store.startswith("file://"):
            why = shared_reason(store.removeprefix("file://"))
            if why:
                raise ConfigError(f"{where}: the store {store} must be visible from the Slurm nodes, but {why}. "
                                  f"Fix: {SHARED_FIX}")
        folder = self.options.log_dir
        if any(c.isspace() or c == "%" for c in folder):
            raise ConfigError(f"{where}: the Slurm log folder {folder!r} has a space or '%', which sbatch cannot "
                              f"take: set SlurmOptions(log_dir=...) or STOKER_HOME to a plain path")
        why = shared_reason(folder)
        if why:
            raise ConfigError(f"{where}: the Slurm log folder {folder} must be visible from the nodes (srun writes "
                              f"the logs there), but {why}. Fix: {SHARED_FIX}, or set SlurmOptions(log_dir=...)")
        python = self.options.python
        if not (os.path.isfile(python) and os.access(python, os.X_OK)):
            raise ConfigError(f"{where}: the nodes would run {python}, which is not an executable file here; set "
                              f"STOKER_SLURM_PYTHON to the interpreter of the environment the nodes share")
        why = shared_reason(python)
        if why and not os.environ.get("STOKER_SLURM_PYTHON"):
            log.info("the nodes will run %s (%s); if they lack it, set STOKER_SLURM_PYTHON", python, why)
        self._check_resources(unit, where)

    def _check_resources(self, unit: Unit, where: str) -> None:
        o = effective_options(unit)
        parts = self.partitions()
        name = o.get("partition") or next((p.name for p in parts.values() if p.default), None)
        known = ", ".join(f"{p.name} ({p.nodes} nodes x {p.cpus} CPUs, {p.memory_mb} MB, {p.gpus} GPUs)"
                          for p in parts.values()) or "none"
        if name is None:
            raise ConfigError(f"{where}: the cluster has no default partition: set @slurm(partition=...) "
                              f"to one of {known}")
        if name not in parts:
            raise ConfigError(f"{where}: @slurm(partition={name!r}) does not exist; the cluster has {known}")
        p = parts[name]
        if p.state != "up":
            raise ConfigError(f"{where}: partition {name!r} is {p.state} (sinfo), so nothing would start: ask the "
                              f"admins or pick another partition ({known})")
        if "time" in o and o["time"] != "UNLIMITED" and p.max_time not in ("infinite", "UNLIMITED", ""):
            if time_to_minutes(o["time"]) > time_to_minutes(p.max_time):
                raise ConfigError(f"{where}: a time limit of {o['time']} (from @slurm(time=) or @timeout) is over "
                                  f"partition {name!r}'s MaxTime {p.max_time}: lower it or pick another partition")
        gpus = int(str(o.get("gpus_per_node", 0)).rsplit(":", 1)[-1])
        asks = [("cpus_per_task", int(o.get("cpus_per_task", 0)), p.cpus, "CPUs"),
                ("mem", mem_to_mb(o["mem"]) if "mem" in o else 0, p.memory_mb, "MB of memory"),
                ("gpus_per_node", gpus, p.gpus, "GPUs")]
        for key, want, have, what in asks:
            if want > have:
                raise ConfigError(f"{where}: asks for {want:g} {what} per node ({key}, from @slurm or @resources) but "
                                  f"the largest node of partition {name!r} has {have}: lower it or pick another "
                                  f"partition ({known})")
        if unit.kind == "gang" and unit.nodes > p.nodes:
            spares = f" and {unit.spares} spare(s) (@torchrun(spares={unit.spares}))" if unit.spares else ""
            raise ConfigError(f"{where}: a gang of {unit.size} nodes (num_parallel={unit.size}){spares} needs "
                              f"{unit.nodes} nodes but partition {name!r} has {p.nodes}: lower num_parallel"
                              f"{' or spares' if unit.spares else ''} or pick a larger partition ({known})")
        nodes, runs_on = o.get("nodes"), unit.size if unit.kind == "gang" else 1
        if nodes is not None and nodes not in (runs_on, unit.nodes if unit.kind == "gang" else runs_on):
            raise ConfigError(f"{where}: @slurm(nodes={nodes}) but the step runs on {runs_on} node(s): drop nodes= "
                              f"(num_parallel sets a gang's size) or make them equal")

    # -- the contract ---------------------------------------------------------------------------------
    def materialize(self, unit: Unit) -> Request:
        return Request(backend=self.name, unit=unit, text=render_sbatch(unit, self.options),
                       payload={"log_dir": log_folder(unit, self.options)})

    def submit(self, request: Request) -> JobRef:
        unit = request.unit
        folder = request.payload.get("log_dir") or log_folder(unit, self.options)
        try:
            os.makedirs(folder, exist_ok=True)  # Slurm does not create it, and a job with nowhere to write is lost
        except OSError as e:
            raise BackendError(f"cannot create the Slurm log folder {folder}: {e}; set STOKER_SLURM_LOG_DIR to a "
                               f"writable folder on the shared filesystem") from e
        job = self.client.sbatch(request.text, env=unit.env)
        extra = {"log_dir": folder, **({"spares": unit.spares} if unit.kind == "gang" and unit.spares else {})}
        ref = JobRef(backend=self.name, job_id=job, members=unit.nodes if unit.kind == "gang" else unit.size,
                     kind=unit.kind, step=unit.step, task_ids=[s.task_id for s in unit.specs], attempt=unit.attempt,
                     extra=extra)
        self._tails[job] = _Tail(ref)
        log.debug("submitted %s as Slurm job %s", unit.label, job)
        return ref

    def poll(self, refs: list[JobRef]) -> dict[str, JobStatus]:
        if not refs:
            return {}
        records = self.client.poll([r.job_id for r in refs], arrays=[r.job_id for r in refs if r.kind == "array"])
        by_job: dict[str, list] = {}
        for rec in records:
            by_job.setdefault(rec.job, []).append(rec)
        out: dict[str, JobStatus] = {}
        for ref in refs:
            st = job_status(ref, by_job.get(ref.job_id, []), cancelled=ref.job_id in self._cancelled)
            if st is None:
                continue
            if ref.kind == "gang" and ref.extra.get("spares"):
                st = self._spares_status(ref, st)
                if st.state == EXITED:
                    self._running_spares.pop(ref.job_id, None)
                else:
                    self._running_spares[ref.job_id] = ref
            elif ref.kind == "gang" and st.state == EXITED:
                st = _gang_members(ref, st)
            out[ref.job_id] = st
            self._tails.setdefault(ref.job_id, _Tail(ref)).status = st  # re-attached refs are tailed too
            if st.hosts and ref.kind != "array":  # where each node runs: a gang's node i is its i-th host
                ref.extra["hosts"] = list(st.hosts)
            if st.state == EXITED:
                self._force_at.pop(ref.job_id, None)
        return out

    def _spares_status(self, ref: JobRef, st: JobStatus) -> JobStatus:
        """A gang with spares: its members apart (states.spare_members); a job whose batch host was lost is ended
        once its member step is over (it would otherwise hold its nodes until its time limit)."""
        if ref.job_id in self._headless:
            return self._headless[ref.job_id]
        st, lost = spare_members(ref, st)
        if st.state == RUNNING:  # the members that have ended: the job goes on while a spare waits
            folder = ref.extra.get("log_dir", "")
            for i in range(ref.members):
                code = _exit_code(member_exit(folder, ref.job_id, i))
                if code is not None and i not in lost:
                    st.members[i] = JobStatus(state=EXITED, exit_code=code, started_at=st.started_at,
                                              hosts=st.hosts[i:i + 1])
        lost_hosts = [st.hosts[i] for i in lost]
        if lost_hosts and ref.extra.get("lost_hosts") != lost_hosts:
            ref.extra["lost_hosts"] = lost_hosts  # shown with the job's record
            log.info("Slurm job %s goes on without node(s) %s", ref.job_id, ", ".join(lost_hosts))
        if 0 in lost and st.state == RUNNING and self.client.steps(ref.job_id) == []:
            host = st.hosts[0]
            log.info("Slurm job %s lost its batch host %s and its members have ended: cancelling it", ref.job_id, host)
            self.client.scancel(ref.job_id)
            ended = {i: JobStatus(state=EXITED, exit_code=0, started_at=st.started_at, hosts=[h],
                                  reason=f"its job lost the batch host {host}; the member had ended")
                     for i, h in enumerate(st.hosts)}
            ended.update(st.members)  # those that left an exit code, or were lost
            st = JobStatus(state=EXITED, exit_code=0, started_at=st.started_at, hosts=st.hosts, members=ended,
                           reason=f"the job lost its batch host {host}; its members had ended")
            self._headless[ref.job_id] = st
        return st

    def cancel(self, ref: JobRef, grace: float = 3.0, member: int | None = None) -> None:
        """A running job: TERM its members now (`scancel --signal=TERM`) and cancel it for good (`scancel`) once
        `grace` has passed (in wait() or close()). Otherwise, or with grace <= 0: `scancel` now, which itself
        TERMs, then KILLs after the cluster's KillWait. `member` of an array: only that element (`JOB_i`)."""
        target = ref.job_id
        if member is not None and ref.kind == "array":
            target = f"{ref.job_id}_{member}"
        else:
            self._cancelled.add(ref.job_id)
        tail = self._tails.get(ref.job_id)
        running = tail is not None and tail.status is not None and tail.status.state == RUNNING
        if grace > 0 and running and self.client.scancel(target, signal="TERM"):
            self._force_at[target] = time.monotonic() + grace
            return
        self._force_at.pop(target, None)
        self.client.scancel(target)

    def _force_due(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for job in [j for j, t in self._force_at.items() if t <= now]:
            del self._force_at[job]
            self.client.scancel(job)

    def logs(self, ref: JobRef, member: int = 0, stream: str = "stdout") -> bytes:
        folder = ref.extra.get("log_dir", "")
        paths = [member_log(folder, ref.job_id, member, stream),
                 batch_log(folder, ref.job_id, member, ref.kind, stream)]
        data = b""
        for path in filter(None, paths):
            try:
                with open(path, "rb") as f:
                    data += f.read()
            except OSError:
                pass
        return data

    def wait(self, timeout: float, sink: Sink) -> None:
        """Sleep up to `timeout` s in short slices, feeding new output of every known job to `sink`."""
        deadline = time.monotonic() + timeout
        while True:
            self._force_due()
            for job, tail in list(self._tails.items()):
                tail.feed(sink)
                if tail.over:
                    del self._tails[job]  # its last bytes are out
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.sleep(min(0.2, left))

    def close(self) -> None:
        """Cancel for good every job whose grace is still running (a `run` that ends leaves nothing behind)."""
        self._force_due(now=float("inf"))
        self._sweep_spares()
        self._tails.clear()

    def _sweep_spares(self) -> None:
        """A gang with spares whose job still runs when the run ends: its waiting spares leave when the gang is over
        (within a second or two), but a job whose batch host died never ends by itself. Give them
        `spares_sweep_s`, then cancel what is left."""
        refs = list(self._running_spares.values())
        deadline = time.monotonic() + self.spares_sweep_s
        while refs:
            try:
                statuses = self.poll(refs)
            except BackendError:
                statuses = {}
            refs = [r for r in refs if (st := statuses.get(r.job_id)) is not None and st.state != EXITED]
            if not refs or time.monotonic() >= deadline:
                break
            self.sleep(0.5)
        for r in refs:
            log.info("Slurm job %s (a gang with spares) still runs after its run ended: cancelling it", r.job_id)
            self.client.scancel(r.job_id)
        self._running_spares.clear()


def _gang_members(ref: JobRef, st: JobStatus) -> JobStatus:
    """A gang's job has ended: each member's own exit code (render.member_exit) where it left one, with the job's
    reason. srun's code, the job's, is one for all nodes: without these, the node that died and those srun stopped
    after it (`--kill-on-bad-exit`) look alike, and the driver would blame node 0's host."""
    folder = ref.extra.get("log_dir", "")
    for i in range(ref.members):
        code = _exit_code(member_exit(folder, ref.job_id, i))
        if code is not None and i not in st.members:
            st.members[i] = JobStatus(state=EXITED, exit_code=code, started_at=st.started_at,
                                      hosts=st.hosts[i:i + 1], reason=st.reason)
    return st


def _exit_code(path: str) -> int | None:
    """The exit code a gang member left (render.member_exit), None while it has not ended."""
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _default_store() -> str:
    from stoker.store.paths import default_store_url

    return default_store_url()
