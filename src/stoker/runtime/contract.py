"""The backend contract: the scheduler decides what runs and when, a backend decides where and how.

    materialize(unit) -> Request    pure, no I/O: one task, a whole gang, or an array of tasks of one step
    submit(request)   -> JobRef     persisted by the scheduler at once (kill / re-attach after a crash)
    poll(refs)        -> statuses   batched: one engine call for every live job, rate-limited by the caller
    cancel(ref, grace[, member])    Ctrl-C, `stoker kill`, gang fail-fast, @timeout (one array element)
    logs(ref, member)               the log of one node of a gang (or one element of an array)

A unit's *members* are its gang nodes (member i is node i) or its array elements. Each member runs the
same task entrypoint from a spec; a gang node learns its index, the main node's address and the rendezvous
port at run time from the engine's environment (see `nodeenv`).

Backends may also stream output (`wait`) and declare what they can do (`Capabilities`); both are optional.
A backend whose members are the run's own processes (local) is an `InProcessBackend`, with the hooks only it needs.
The scheduler imports only this module, never a backend.
"""

from __future__ import annotations

import json
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from stoker.runtime.spec import TaskSpec

QUEUED, RUNNING, EXITED = "queued", "running", "exited"
# stream output: sink(ref, member, stream, data)
Sink = Callable[["JobRef", int, str, bytes], None]


@dataclass
class Capabilities:
    """Declared by each backend and checked before anything is submitted."""

    multi_node: bool = True
    gpus: int = 0
    trainium: int = 0
    efa: bool = False
    cpus: float = 1
    memory_mb: float = 0
    notes: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class Unit:
    """What the scheduler hands a backend: `kind` "task" (one member), "gang" or "array"."""

    kind: str
    flow: str
    run_id: str
    step: str
    specs: list[TaskSpec]  # one per member
    options: dict[str, Any] = field(default_factory=dict)  # the step's backend decorator, e.g. @slurm(...)
    resources: dict[str, Any] = field(default_factory=dict)  # the step's @resources (per node)
    timeout_s: float | None = None  # the step's @timeout
    env: dict[str, str] = field(default_factory=dict)  # non-secret values every member gets
    store_url: str = ""
    code_key: str | None = None  # the code package blob (remote backends)
    spec_key: str | None = None  # the unit spec blob (remote backends)
    flow_path: str = ""  # the flow file inside the code package
    throttle: int | None = None  # an array: at most this many members run at once
    exclude_hosts: list[str] = field(default_factory=list)  # hosts that failed this run twice (engines that can avoid)
    spares: int = 0  # a gang's hot spares (@torchrun(spares=k)): the engine starts size + spares members
    first_slots: list[int] = field(default_factory=list)  # a gang with spares: generation 0's member of each node

    @property
    def nodes(self) -> int:
        """How many members the engine starts: the gang's nodes and its spares (distributed/gangboard.py)."""
        return len(self.specs) + self.spares

    @property
    def size(self) -> int:
        return len(self.specs)

    @property
    def attempt(self) -> int:
        return self.specs[0].attempt

    @property
    def label(self) -> str:
        first = self.specs[0]
        tail = f"{first.task_id}" + (f"+{self.size - 1}" if self.size > 1 else "")
        return f"{self.flow}/{self.run_id}/{self.step}/{tail}" + (f"/attempt {self.attempt}" if self.attempt else "")

    def spec_document(self) -> bytes:
        """The unit spec blob a remote member reads: its own spec is `specs[member]`."""
        doc = {"kind": self.kind, "flow_path": self.flow_path, "specs": [json.loads(s.to_json()) for s in self.specs],
               "resources": self.resources, "options": self.options}
        if self.spares:
            doc.update(spares=self.spares, first_slots=self.first_slots)
        return json.dumps(doc, sort_keys=True).encode()

    def node_command(self, python: str | None = None, module: str = "stoker.runtime.node") -> list[str]:
        """What every member runs on a remote node (secrets never appear here: only blob keys); `module`: the
        engine's node entrypoint (backends/<engine>/node.py), which knows how to read its environment."""
        return [python or sys.executable, "-m", module, "--store", self.store_url,
                "--code", self.code_key or "-", "--spec", self.spec_key or "-"]


@dataclass
class Request:
    """A materialized submission: `text` is what --dry-run prints (an sbatch script, API payloads)."""

    backend: str
    unit: Unit
    text: str
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass
class JobRef:
    """A submitted unit. JSON-serializable: it is persisted in the run's folder of the store."""

    backend: str
    job_id: str
    members: int = 1
    kind: str = "task"
    step: str = ""
    task_ids: list[str] = field(default_factory=list)
    attempt: int = 0
    submitted_at: float = field(default_factory=time.time)
    extra: dict[str, Any] = field(default_factory=dict)  # backend-specific (log folder, pids ...)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> JobRef:
        return cls(**json.loads(text))


@dataclass
class JobStatus:
    """The state of a job (or of one member): queued / running / exited with an exit code.

    `reason` is the engine's own account of an abnormal end ("cancelled", "time limit", "node failure",
    "out of memory"); `members` overrides the job-level fields for members the engine reports apart (array
    elements, local gang nodes)."""

    state: str
    exit_code: int | None = None
    started_at: float | None = None
    hosts: list[str] = field(default_factory=list)
    reason: str | None = None
    members: dict[int, JobStatus] = field(default_factory=dict)
    blocked: bool = False  # queued, and the engine will never start it as submitted (the reason says why)

    def member(self, i: int) -> JobStatus:
        return self.members.get(i, self)


class Backend(ABC):
    """One engine: local processes, Slurm, AWS Batch ... (see the module docstring)."""

    name = "base"
    remote = True  # members cannot see the scheduler's memory: stage the code package and spec blob first
    arrays = False  # accepts units of kind "array"
    persist_refs = True  # job refs outlive the scheduler (a crashed `run` must be able to cancel them)
    poll_interval = 1.0  # the least seconds between two poll() calls
    # a gang with spares: the engine's main node (member 0) starts as a spare, kept for last, because its exit ends
    # the whole job (AWS Batch); elsewhere members 0..N-1 run the nodes and the spares are the members after them
    main_node_spare = False

    def capabilities(self) -> Capabilities:
        return Capabilities()

    def check(self, unit: Unit) -> None:
        """Refuse, before anything is submitted, a unit that cannot work here (ConfigError with the fix).
        Called once per step with a representative unit; may do I/O (e.g. ask the engine for its nodes)."""
        return None

    @abstractmethod
    def materialize(self, unit: Unit) -> Request:
        """Turn a unit into the engine's request. Pure: no I/O."""

    @abstractmethod
    def submit(self, request: Request) -> JobRef: ...

    @abstractmethod
    def poll(self, refs: list[JobRef]) -> dict[str, JobStatus]:
        """Statuses keyed by job_id, in one engine call for all refs. A ref missing from the answer is
        unknown to the engine (it is treated as still queued, then lost after a while)."""

    @abstractmethod
    def cancel(self, ref: JobRef, grace: float = 3.0, member: int | None = None) -> None:
        """Stop every member (or only `member` of an array): ask nicely, and force after `grace` seconds."""

    @abstractmethod
    def logs(self, ref: JobRef, member: int = 0, stream: str = "stdout") -> bytes:
        """What member `member` printed so far (b"" when nothing is known)."""

    def wait(self, timeout: float, sink: Sink) -> None:
        """Block up to `timeout` s or until something may have changed, feeding new output to `sink`."""
        time.sleep(timeout)

    def close(self) -> None:
        """Release what the backend holds (threads, fds)."""
        return None


class InProcessBackend(Backend):
    """A backend whose members are the run's own processes (the local one): it is handed the in-process task
    entrypoint, may start before the run is registered, starts a pass's submissions together, and hands finished
    members' manifests over directly. The scheduler asks `isinstance(b, InProcessBackend)`; other engines know
    none of this."""

    remote = False
    persist_refs = False

    @abstractmethod
    def bind(self, entry: Callable[[TaskSpec], int], preload: Callable[[], None] | None = None) -> None:
        """The in-process task entrypoint the members run, and what to import before forking them."""

    def start_early(self) -> None:
        """Get ready while the run registers (e.g. fork a server that preloads)."""
        return None

    def dispatch(self) -> None:
        """Start what submit() has queued (the scheduler calls it after each admission pass)."""
        return None

    def handed(self, ref: JobRef, member: int) -> bytes | None:
        """The manifest member `member` handed over as it finished (runtime/member/handover.py), or None: the
        scheduler reads it from the store."""
        return None
