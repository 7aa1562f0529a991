"""The client API, following Metaflow's: ``Metaflow``, ``Flow``, ``Run``, ``Step``, ``Task``, ``DataArtifact``.

    from stoker import Flow, namespace
    run = Flow("HelloFlow").latest_successful_run
    run["train"].task.data.loss          # an artifact, loaded lazily from the blob store
    for task in run["train"]: print(task.index, task.stdout)

Objects read the metadata index and the blob store at their default locations (``$STOKER_HOME``)
unless given ``db=`` and ``store=``; children share their parent's. Only runs in the current namespace
(``user:$USER`` by default, see :mod:`stoker.client.namespaces`) are listed or opened.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from stoker.client.base import (
    ArtifactBase,
    ClientObject,
    Metadata,
    TagMutations,
    TaskData,
    TaskException,
    client_db,
    dt_or_none,
    split_pathspec,
)
from stoker.client.lineage import (
    child_task_pathspecs,
    loglines,
    parent_task_pathspecs,
    run_graph,
    task_metadata,
)
from stoker.client.namespaces import NotFound, check_namespace, get_namespace
from stoker.store.blobs import BlobStore
from stoker.store.manifest import log_name
from stoker.store.metadata import MetadataDB
from stoker.store.records import ArtifactRecord, RunRecord, TaskRecord
from stoker.store.runstate import RunState, run_state

__all__ = ["DataArtifact", "Flow", "Metadata", "Metaflow", "Run", "Step", "Task", "TaskData", "TaskException"]


class Metaflow:
    """Entry point listing every flow in the metadata index."""

    def __init__(self, *, db: MetadataDB | None = None, store: BlobStore | None = None) -> None:
        self._db = db if db is not None else client_db()
        self._store = store

    @property
    def flows(self) -> list[Flow]:
        """Every recorded flow, by name."""
        return [Flow(name, db=self._db, store=self._store) for name in self._db.list_flows()]

    def __iter__(self) -> Iterator[Flow]:
        return iter(self.flows)

    def __getitem__(self, name: str) -> Flow:
        return Flow(name, db=self._db, store=self._store)

    def __repr__(self) -> str:
        return f"Metaflow({self._db.path})"


class Flow(ClientObject):
    """A flow: its runs in the current namespace, newest first."""

    def __init__(self, name: str, *, db: MetadataDB | None = None, store: BlobStore | None = None,
                 _namespace_check: bool = True) -> None:
        super().__init__(split_pathspec(name, 1, "flow")[0], db, store)
        if not self._db.has_flow(self.id):
            raise NotFound(f"flow {self.id!r} has no runs recorded in {self._db.path} (check the name, and "
                           f"STOKER_HOME if the runs were made elsewhere)")

    def _run_tags(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return (), ()  # as Metaflow's: a flow carries no tags of its own, its runs do

    def runs(self, *tags: str) -> Iterator[Run]:
        """Runs carrying all ``tags`` (and the namespace's tag), newest first."""
        ns = get_namespace()
        records = self._db.list_runs(self.id, tags=[*tags, *([ns] if ns else [])])
        return iter([Run(r.pathspec, _record=r, **self._kw()) for r in records])

    def __iter__(self) -> Iterator[Run]:
        return self.runs()

    def __getitem__(self, run_id: str) -> Run:
        return Run(f"{self.id}/{run_id}", db=self._db, store=self._store_obj)

    def __contains__(self, run_id: str) -> bool:
        try:
            self[run_id]
        except NotFound:
            return False
        return True

    @property
    def latest_run(self) -> Run | None:
        """The newest run in the namespace, or None."""
        return next(self.runs(), None)

    @property
    def latest_successful_run(self) -> Run | None:
        """The newest successful run in the namespace, or None."""
        return next((r for r in self.runs() if r.successful), None)


class Run(TagMutations, ClientObject):
    """A run of a flow: ``Run("Flow/run_id")``."""

    def __init__(self, pathspec: str, *, db: MetadataDB | None = None, store: BlobStore | None = None,
                 _namespace_check: bool = True, _record: RunRecord | None = None) -> None:
        flow, run_id = split_pathspec(pathspec, 2, "run")
        super().__init__(f"{flow}/{run_id}", db, store)
        rec = _record or self._db.get_run(flow, run_id)
        if rec is None:
            raise NotFound(f"run {self.pathspec} does not exist in {self._db.path}")
        if _namespace_check:
            check_namespace(self.pathspec, rec.tags)
        self._rec = rec
        self._user_tags = rec.user_tags  # as Metaflow's: fixed when looked up, then set by its own tag changes
        self.flow_name = flow

    @property
    def parent(self) -> Flow:
        return Flow(self.flow_name, **self._kw())

    def _refresh(self) -> RunRecord:
        rec = self._db.get_run(self.flow_name, self.id)
        if rec is not None:
            self._rec = rec
        return self._rec

    def _state(self) -> RunState:
        rec = self._refresh()
        if rec.status != "running":
            return RunState(rec.status)
        try:
            store = self._store
        except Exception:  # noqa: BLE001 - a store this machine cannot open: the index's word stands
            store = None
        return run_state(store, self.flow_name, self.id, rec.status)

    @property
    def status(self) -> str:
        """running, succeeded, failed or killed (re-read from the index); ``lost`` when the index says running but
        its driver is gone without recording the end (:attr:`lost_reason` says why and how to continue it)."""
        return self._state().status

    @property
    def lost_reason(self) -> str | None:
        """Why a ``lost`` run is lost and how to continue it; None for any other run."""
        return self._state().note

    @property
    def successful(self) -> bool:
        return self.status == "succeeded"

    @property
    def finished(self) -> bool:
        return self.status != "running"

    @property
    def created_at(self) -> datetime:
        return dt_or_none(self._rec.created_at)  # type: ignore[return-value]

    @property
    def finished_at(self) -> datetime | None:
        return dt_or_none(self._refresh().finished_at)

    @property
    def user(self) -> str | None:
        return self._rec.user

    def _run_tags(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """As Metaflow's Run: the tags it had when it was looked up, then those its own tag changes left (so sibling
        tasks that change the same run's tags do not see each other's changes half-way); look the run up again to
        see others' changes."""
        return self._user_tags, self._rec.system_tags

    @property
    def parameters(self) -> dict[str, Any]:
        """The run's parameter values as recorded at its start."""
        return dict(self._rec.params)

    @property
    def config(self) -> dict[str, Any] | None:
        """The run's resolved configuration (None if it had none)."""
        return self._rec.config

    @property
    def origin_run_id(self) -> str | None:
        """The run this one resumed, if any."""
        return self._rec.origin_run_id

    @property
    def origin_pathspec(self) -> str | None:
        """``Flow/run_id`` of the run this one resumed, None if it resumed none. (Metaflow 2.19 gives
        ``Flow/None`` for a run that is not a resume.)"""
        return f"{self.flow_name}/{self._rec.origin_run_id}" if self._rec.origin_run_id else None

    def steps(self, *tags: str) -> Iterator[Step]:
        """The run's steps, most recently started first (as Metaflow); with ``tags``, only those carrying them
        all (a step carries its run's tags)."""
        if tags and not set(tags) <= self.tags:
            return iter([])
        recs = self._db.list_steps(self.flow_name, self.id)
        return iter([Step(s.pathspec, **self._kw()) for s in reversed(recs)])

    def __iter__(self) -> Iterator[Step]:
        return self.steps()

    def __getitem__(self, step: str) -> Step:
        return Step(f"{self.pathspec}/{step}", **self._kw())

    def __contains__(self, step: str) -> bool:
        return self._db.get_step(self.flow_name, self.id, step) is not None

    @property
    def end_task(self) -> Task | None:
        """The task of the ``end`` step, or None if the run did not get there."""
        return self["end"].task if "end" in self else None

    @property
    def data(self) -> TaskData | None:
        """The artifacts of the ``end`` task (None if the run has no end task)."""
        end = self.end_task
        return None if end is None else end.data

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """Every task's training metrics (a dict per logged step, with "step_name", "task_id", "attempt" and
        "run_id"), read live from the store; a resumed run's curves continue those of the run it resumed."""
        from stoker.store.metrics import run_metrics

        return run_metrics(self._db, self._store, self.flow_name, self.id)

    def metrics_frame(self) -> Any:
        """:attr:`metrics` as a pandas DataFrame (ImportError naming ``pip install pandas`` without pandas)."""
        from stoker.store.metrics import metrics_frame

        return metrics_frame(self.metrics)

    @property
    def goodput(self) -> dict[str, Any]:
        """Where the wall time of every training step went, per attempt and node, read from the store (the goodput
        ledger: :func:`stoker.client.goodput.run_goodput`; ``stoker goodput FLOW/RUN`` adds the cost estimate)."""
        from stoker.client.goodput import run_goodput

        return run_goodput(self._store, self.flow_name, self.id)


class Step(ClientObject):
    """A step of a run: ``Step("Flow/run_id/step")``; iterating gives its tasks."""

    def __init__(self, pathspec: str, *, db: MetadataDB | None = None, store: BlobStore | None = None,
                 _namespace_check: bool = True) -> None:
        flow, run_id, step = split_pathspec(pathspec, 3, "step")
        super().__init__(f"{flow}/{run_id}/{step}", db, store)
        self.flow_name, self.run_id = flow, run_id
        if _namespace_check:
            Run(f"{flow}/{run_id}", db=self._db, store=store)
        rec = self._db.get_step(flow, run_id, step)
        if rec is None:
            raise NotFound(f"step {self.pathspec} does not exist (run {flow}/{run_id} has "
                           f"{[s.step for s in self._db.list_steps(flow, run_id)]})")
        self._rec = rec

    @property
    def parent(self) -> Run:
        return Run(f"{self.flow_name}/{self.run_id}", **self._kw())

    @property
    def created_at(self) -> datetime:
        return dt_or_none(self._rec.created_at)  # type: ignore[return-value]

    @property
    def finished_at(self) -> datetime | None:
        rec = self._db.get_step(self.flow_name, self.run_id, self.id)
        return dt_or_none(rec.finished_at if rec else None)

    @property
    def origin_pathspec(self) -> str | None:
        """``Flow/origin_run/step`` when the run resumed another one, else None."""
        origin = self.parent.origin_pathspec
        return f"{origin}/{self.id}" if origin else None

    def _graph(self) -> dict[str, list[str]]:
        return run_graph(self._store, self.flow_name, self.run_id)

    @property
    def parent_steps(self) -> Iterator[Step]:
        """The steps that lead to this one in the flow's graph (none for ``start``), as in Metaflow."""
        run = f"{self.flow_name}/{self.run_id}"
        return iter([Step(f"{run}/{name}", **self._kw()) for name, nxt in self._graph().items()
                     if self.id in nxt and self._db.get_step(self.flow_name, self.run_id, name) is not None])

    @property
    def child_steps(self) -> Iterator[Step]:
        """The steps this one leads to in the flow's graph (none for ``end``), those the run has reached."""
        run = f"{self.flow_name}/{self.run_id}"
        return iter([Step(f"{run}/{name}", **self._kw()) for name in self._graph().get(self.id, [])
                     if self._db.get_step(self.flow_name, self.run_id, name) is not None])

    def tasks(self, *tags: str) -> Iterator[Task]:
        """The step's tasks, in foreach-index then task-id order (``tags``: only if the run has them all)."""
        if tags and not set(tags) <= self.tags:
            return iter([])
        recs = self._db.list_tasks(self.flow_name, self.run_id, self.id)
        return iter([Task(t.pathspec, _record=t, **self._kw()) for t in recs])

    def control_tasks(self, *tags: str) -> Iterator[Task]:
        """The control tasks of a gang (``num_parallel``) step: its node 0, which runs the step's ``self.next``
        (Metaflow's ``Step.control_tasks``); none for any other step."""
        return iter([t for t in self.tasks(*tags) if (t._m("parallel") or {}).get("node_index") == 0])

    def __iter__(self) -> Iterator[Task]:
        return self.tasks()

    @property
    def task(self) -> Task | None:
        """The step's first task (the only one unless the step is in a foreach or a gang)."""
        return next(self.tasks(), None)

    def __getitem__(self, task_id: str) -> Task:
        return Task(f"{self.pathspec}/{task_id}", **self._kw())

    @property
    def generations(self) -> list[dict[str, Any]]:
        """A gang step with hot spares (``@torchrun(spares=k)``): each gang attempt's generations, oldest first:
        which node left (its member, host and why), which spare joined, the recovery time
        (:func:`stoker.client.gangs.step_gangs` lists the keys); empty for a step without spares."""
        from stoker.client.gangs import step_gangs

        return step_gangs(self._store, self.flow_name, self.run_id, self.id)


class Task(ClientObject):
    """A task: ``Task("Flow/run_id/step/task_id", attempt=None)``; its latest attempt by default."""

    def __init__(self, pathspec: str, *, attempt: int | None = None, db: MetadataDB | None = None,
                 store: BlobStore | None = None, _namespace_check: bool = True,
                 _record: TaskRecord | None = None) -> None:
        flow, run_id, step, task_id = split_pathspec(pathspec, 4, "task")
        super().__init__(f"{flow}/{run_id}/{step}/{task_id}", db, store)
        self.flow_name, self.run_id, self.step_name = flow, run_id, step
        if _namespace_check:
            Run(f"{flow}/{run_id}", db=self._db, store=store)
        rec = _record or self._db.get_task(flow, run_id, step, task_id)
        if rec is None:
            raise NotFound(f"task {self.pathspec} does not exist")
        self._rec = rec
        self._asked_attempt = attempt
        self._attempt_no = rec.attempt if attempt is None else int(attempt)
        self._attempt = self._db.get_attempt(flow, run_id, step, task_id, self._attempt_no)
        if self._attempt is None:
            raise NotFound(f"task {self.pathspec} has no attempt {attempt}")
        self._data: TaskData | None = None

    @property
    def parent(self) -> Step:
        return Step(f"{self.flow_name}/{self.run_id}/{self.step_name}", **self._kw())

    @property
    def manifest(self) -> dict[str, Any] | None:
        """The attempt's manifest (None while the attempt runs)."""
        return self._attempt.manifest  # type: ignore[union-attr]

    def _m(self, key: str, default: Any = None) -> Any:
        m = self.manifest
        return default if m is None else m.get(key, default)

    @property
    def current_attempt(self) -> int:
        return self._attempt_no

    @property
    def retry_count(self) -> int:
        """Which attempt this is (0 for the first)."""
        return int(self._m("retry_count", self._attempt_no))

    @property
    def successful(self) -> bool:
        return self._attempt.status == "ok"  # type: ignore[union-attr]

    @property
    def finished(self) -> bool:
        return self._attempt.status != "running"  # type: ignore[union-attr]

    @property
    def created_at(self) -> datetime | None:
        return dt_or_none(self._attempt.started_at)  # type: ignore[union-attr]

    @property
    def finished_at(self) -> datetime | None:
        return dt_or_none(self._attempt.finished_at)  # type: ignore[union-attr]

    @property
    def index(self) -> int | None:
        """The index of this task in its innermost foreach, or None outside a foreach."""
        stack = self.foreach_stack
        if stack:
            index = stack[-1].get("index")
            return None if index is None else int(index)
        return self._rec.foreach_index[-1] if self._rec.foreach_index else None

    @property
    def foreach_stack(self) -> list[dict[str, Any]]:
        return list(self._m("foreach_stack", []) or [])

    @property
    def parallel(self) -> dict[str, Any] | None:
        """``{"node_index", "num_nodes"}`` for a task of a gang, else None."""
        return self._m("parallel")

    @property
    def generations(self) -> list[dict[str, Any]]:
        """The generations of the gang attempt this task attempt ran in (a gang step with hot spares; empty
        otherwise): :func:`stoker.client.gangs.read_gang`'s ``generations``, oldest first."""
        from stoker.client.gangs import step_gangs

        if not self.parallel and self._attempt.status != "running":  # type: ignore[union-attr]
            return []
        gangs = [g for g in step_gangs(self._store, self.flow_name, self.run_id, self.step_name)
                 if g["attempt"] == self._attempt_no]
        mine = [g for g in gangs if g["task_id"] == self.id]  # node 0's task holds its gang's objects
        if not mine and len(gangs) == 1:  # another node of the step's one gang
            mine = gangs
        return mine[0]["generations"] if mine else []

    @property
    def input_paths(self) -> list[str]:
        return list(self._m("input_paths", []) or [])

    @property
    def origin_pathspec(self) -> str | None:
        """``Flow/origin_run/step/task`` of the task this one was cloned from by ``resume``, else None."""
        origin = self._m("origin_task")
        step = self.parent.origin_pathspec if origin else None
        return f"{step}/{origin.rsplit('/', 1)[-1]}" if step else origin

    @property
    def parent_tasks(self) -> Iterator[Task]:
        """The tasks whose outputs this one took as inputs (none for ``start``)."""
        return iter([Task(p, **self._kw()) for p in parent_task_pathspecs(self)])

    @property
    def child_tasks(self) -> Iterator[Task]:
        """The tasks that took this one's outputs as inputs (none for ``end``, nor before they start)."""
        return iter([Task(p, **self._kw()) for p in child_task_pathspecs(self)])

    @property
    def parent_task_pathspecs(self) -> Iterator[str]:
        return iter(parent_task_pathspecs(self))

    @property
    def child_task_pathspecs(self) -> Iterator[str]:
        return iter(child_task_pathspecs(self))

    @property
    def exception(self) -> TaskException | None:
        """What the attempt raised (None if it succeeded or @catch caught it)."""
        exc = self._m("exception")
        return None if not exc else TaskException(exc.get("type", ""), exc.get("message", ""),
                                                  exc.get("traceback", ""), exc.get("cause"), exc.get("evidence"))

    def _log(self, stream: str) -> str:
        logs = self._m("logs", {}) or {}
        name = logs.get(stream) or log_name(self.flow_name, self.run_id, self.step_name, self.id,
                                            self._attempt_no, stream)
        if not self._store.exists(name):  # a remote task still running: the chunks it uploaded so far
            parts = sorted(self._store.list(name + ".parts/"))
            return b"".join(self._store.read(p) for p in parts).decode("utf-8", errors="replace")
        return self._store.read(name).decode("utf-8", errors="replace")

    @property
    def stdout(self) -> str:
        return self._log("stdout")

    @property
    def stderr(self) -> str:
        return self._log("stderr")

    @property
    def stdout_size(self) -> int:
        """Bytes of the attempt's stdout so far."""
        return len(self._log("stdout").encode())

    @property
    def stderr_size(self) -> int:
        """Bytes of the attempt's stderr so far."""
        return len(self._log("stderr").encode())

    def loglines(self, stream: str, as_unicode: bool = True, meta_dict: dict | None = None
                 ) -> Iterator[tuple[datetime | None, str | bytes]]:
        """``(timestamp, line)`` for each line of ``stream`` ("stdout" or "stderr"), as Metaflow's. stoker does
        not stamp each line: the timestamp is when the attempt started (naive UTC, as Metaflow's)."""
        return loglines(self, stream, as_unicode)

    @property
    def runtime_name(self) -> str:
        """The runtime the task ran on: ``dev`` (stoker's scheduler), as Metaflow's local runs say."""
        return "dev"

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """The training metrics of every attempt of the task, oldest first (a dict per logged step: "step",
        "loss", "lr", ..., "attempt", "run_id"), read live from the store while the task runs. A task of a
        resumed run starts with the records of the run it resumed, up to its own first step."""
        from stoker.store.metrics import task_metrics

        return task_metrics(self._db, self._store, self.flow_name, self.run_id, self.step_name, self.id)

    def metrics_frame(self) -> Any:
        """:attr:`metrics` as a pandas DataFrame (ImportError naming ``pip install pandas`` without pandas)."""
        from stoker.store.metrics import metrics_frame

        return metrics_frame(self.metrics)

    @property
    def attempts(self) -> list[Task]:
        """Every attempt of the task, oldest first, as Task objects."""
        return [Task(self.pathspec, attempt=a.attempt, _record=self._rec, **self._kw())
                for a in self._db.list_attempts(self.flow_name, self.run_id, self.step_name, self.id)]

    @property
    def metadata(self) -> list[Metadata]:
        """Metadata events of every attempt of the task (of this attempt only if one was asked for), with
        Metaflow's names: ``attempt``, ``origin-run-id``, ``origin-task-id`` (cloned tasks), ``user``, ``runtime``,
        ``script-name``, ``ds-type``, ``ds-root``, ``python_version``, ``foreach-execution-path``, ``attempt_ok``,
        ``attempt-done``,
        plus stoker's ``hostname``, ``status``, ``retry_count``, ``catch_var`` and ``parallel_*``."""
        return task_metadata(self)

    @property
    def metadata_dict(self) -> dict[str, Any]:
        """:attr:`metadata` as {name: value}, the newest event of each name (the latest attempt's)."""
        return {m.name: m.value for m in sorted(self.metadata, key=lambda m: m.created_at)}

    def _records(self) -> list[ArtifactRecord]:
        return self._db.list_artifacts(self.flow_name, self.run_id, self.step_name, self.id, self._attempt_no)

    @property
    def data(self) -> TaskData:
        """Artifacts as attributes: ``task.data.loss`` (loaded on first access)."""
        if self._data is None:
            self._data = TaskData({r.name: DataArtifact._from(self, r) for r in self._records()}, self.pathspec)
        return self._data

    @property
    def artifacts(self) -> TaskData:
        """The DataArtifact objects as attributes (``task.artifacts.loss.sha``) and by iteration."""
        return TaskData(self.data._artifacts, self.pathspec, values=False)

    def __getitem__(self, name: str) -> DataArtifact:
        try:
            return self.data._artifacts[name]
        except KeyError:
            raise NotFound(f"task {self.pathspec} has no artifact {name!r} (it has "
                           f"{sorted(self.data._artifacts)})") from None

    def __contains__(self, name: str) -> bool:
        return name in self.data._artifacts

    def __iter__(self) -> Iterator[DataArtifact]:
        return iter(list(self.data._artifacts.values()))


class DataArtifact(ArtifactBase):
    """One artifact of a task: ``.data`` (loaded on first access, then cached), ``.sha``, ``.size``."""

    def __init__(self, pathspec: str, *, attempt: int | None = None, db: MetadataDB | None = None,
                 store: BlobStore | None = None, _namespace_check: bool = True) -> None:
        flow, run_id, step, task_id, name = split_pathspec(pathspec, 5, "artifact")
        task = Task(f"{flow}/{run_id}/{step}/{task_id}", attempt=attempt, db=db, store=store,
                    _namespace_check=_namespace_check)
        rec = next((r for r in task._records() if r.name == name), None)
        if rec is None:
            raise NotFound(f"task {task.pathspec} has no artifact {name!r}")
        self._init(task, rec)
