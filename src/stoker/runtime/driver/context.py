"""What a run is asked to do (`RunRequest`) and what it is once set up (`RunContext`): the run-wide values the
scheduler and every task spec share, passed as one object instead of long parameter lists."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stoker.flow.frames import ForeachFrame
from stoker.flow.graph import FlowGraph
from stoker.runtime.contract import Backend, JobRef
from stoker.runtime.spec import GangSlot, TaskSpec
from stoker.store.blobs import BlobStore
from stoker.store.metadata import MetadataDB

Router = Callable[[str], Backend]  # step name -> the backend that runs it


@dataclass
class RunRequest:
    """A `run` or `resume` as the caller asked for it (the command line, the Runner, a test)."""

    params: dict[str, Any] = field(default_factory=dict)  # --NAME VALUE, as typed (the Parameters convert them)
    config_paths: dict[str, str] = field(default_factory=dict)  # --config NAME PATH
    overrides: dict[str, Any] = field(default_factory=dict)  # --set KEY=VALUE (dotted config keys)
    with_specs: list[str] = field(default_factory=list)  # --with DECORATOR[:k=v,...]
    tags: list[str] = field(default_factory=list)  # --tag
    max_workers: int = 16  # tasks running at once on this machine
    store: BlobStore | None = None  # default: open_store() ($STOKER_STORE or the home's folder)
    db: MetadataDB | None = None  # default: the home's index
    run_id: str | None = None  # chosen by the caller (the Runner's attribute file), else new
    origin_run_id: str | None = None  # resume: the run whose successful tasks are cloned
    rerun_steps: set[str] = field(default_factory=set)  # resume --step: steps run again even if they succeeded
    quiet: bool = False  # no progress on the console (the run's end still prints)
    run_id_file: str | None = None  # --run-id-file: where to write the run id once it is known
    on_submit: Callable[[JobRef, str, str], None] | None = None  # told of every remote job (the guardian)
    project_options: dict[str, Any] | None = None  # @project's `branch` / `production` from the command line
    resume_options: list[str] = field(default_factory=list)  # what `resume` must repeat (--backend, --with)
    hang_timeout_s: float | None = None  # --hang-timeout: no progress this long stops a gang as hung (0: off)


@dataclass
class RunContext:
    """A registered run: what the scheduler needs and every task's spec carries."""

    flow_cls: type
    graph: FlowGraph
    run_id: str
    store: BlobStore
    db: MetadataDB
    router: Router
    run_inputs: dict[str, dict]  # name -> artifact descriptor of every Parameter / IncludeFile / Config
    user: str
    tags: list[str] = field(default_factory=list)  # system tags first, so a user's `project:x` is not @project's
    origin: dict[tuple, dict] = field(default_factory=dict)  # resume: the origin run's manifests by task key
    origin_run_id: str | None = None
    rerun_steps: set[str] = field(default_factory=set)
    flow_file: str = ""
    with_specs: list[str] = field(default_factory=list)
    package: tuple[str, str] | None = None  # (blob key, flow path) of the code package, for remote backends
    hang_timeout_s: float | None = None  # the run's hang timeout for gangs (runtime/member/watchdog.py)

    @property
    def flow(self) -> str:
        return self.graph.name

    def task_spec(self, *, step: str, task_id: str, attempt: int, max_attempts: int, inputs: list[str],
                  foreach: list[ForeachFrame], parallel: GangSlot | None, iteration: list) -> TaskSpec:
        """A task attempt's spec: its own fields, and the run's, filled in here only."""
        return TaskSpec(flow=self.flow, run_id=self.run_id, step=step, task_id=task_id, attempt=attempt,
                        max_attempts=max_attempts, inputs=inputs, foreach=foreach, parallel=parallel,
                        iteration=iteration, run_inputs=self.run_inputs, user=self.user, tags=self.tags,
                        origin_run_id=self.origin_run_id, store_url=self.store.url, flow_file=self.flow_file,
                        flow_class=self.flow_cls.__name__, with_decorators=self.with_specs,
                        hang_timeout_s=self.hang_timeout_s)
