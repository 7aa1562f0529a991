"""`current`: what a running task knows about itself (flow, run, step, task, retry, gang position).

As in Metaflow, the attributes every task has (`flow_name`, `run_id`, `step_name`, `task_id`, `retry_count`,
`origin_run_id`, `pathspec`, `namespace`, `username`, `task`, `run`) are None outside a running task, `tempdir` is
"." there and `is_running_flow` is False; the ones a task adds (`parameter_names`, `parallel`, `is_parallel`,
`tags`, `card`, `torch`, ...) exist only inside it, and reading them elsewhere raises AttributeError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TEMPDIR = "."  # Metaflow's `current.tempdir` outside a task (its METAFLOW_TEMPDIR default)


@dataclass(frozen=True)
class ParallelInfo:
    """A gang node's view of its gang (`current.parallel`)."""

    main_ip: str = "127.0.0.1"
    num_nodes: int = 1
    node_index: int = 0
    control_task_id: str | None = None
    port: int | None = None
    member: int | None = None  # with spares (@torchrun(spares=k)): the engine member that runs this node now
    spares: int = 0  # the gang's hot spares


def _task_value(name: str, doc: str) -> property:
    return property(lambda self: self._values.get(name), doc=doc)


class Current:
    """Attributes are set by the task entrypoint; outside a task they are None (and `is_running_flow` False)."""

    flow_name = _task_value("flow_name", "The name of the running flow.")
    run_id = _task_value("run_id", "The id of the running run.")
    step_name = _task_value("step_name", "The name of the running step.")
    task_id = _task_value("task_id", "The id of the running task.")
    retry_count = _task_value("retry_count", "Which attempt this is: 0 for the first, 1 after one retry ...")
    origin_run_id = _task_value("origin_run_id", "The run this run resumes, None for an ordinary run.")
    namespace = _task_value("namespace", "The namespace of the running task (user:<name>).")
    username = _task_value("username", "The user who started the run.")

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}

    def _set(self, **values: Any) -> None:
        self._values.update(values)

    def _clear(self) -> None:
        self._values.clear()

    def get(self, name: str, default: Any = None) -> Any:
        """`getattr(current, name, default)`, as Metaflow's `current.get`."""
        return getattr(self, name, default)

    def __contains__(self, name: str) -> bool:
        return getattr(self, name, None) is not None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        values = self.__dict__.get("_values", {})
        if name in values:
            return values[name]
        where = "in this task" if values.get("is_running_flow") else "outside a running task"
        raise AttributeError(f"'Current' object has no attribute {name!r} ({where})")

    @property
    def tempdir(self) -> str | None:
        """A folder of this task, removed when it ends ("." outside a task, as in Metaflow)."""
        return self._values.get("tempdir", TEMPDIR)

    @property
    def is_running_flow(self) -> bool:
        """True inside a running task."""
        return bool(self._values.get("is_running_flow"))

    @property
    def pathspec(self) -> str | None:
        """FLOW/RUN_ID/STEP/TASK_ID of the running task."""
        parts = [self._values.get(k) for k in ("flow_name", "run_id", "step_name", "task_id")]
        return None if any(p is None for p in parts) else "/".join(str(p) for p in parts)

    @property
    def task(self) -> Any:
        """The client's Task of the running task (None outside a task)."""
        path = self.pathspec
        if path is None:
            return None
        from stoker.client import Task
        from stoker.client.namespaces import NotFound

        try:
            return Task(path, _namespace_check=False)
        except NotFound:  # the scheduler indexes the tasks it started once they are forked: this one came first
            if not self._register_self():
                raise
        return Task(path, _namespace_check=False)

    def _register_self(self) -> bool:
        """Index the running attempt as the scheduler would (``running``; idempotent, the scheduler's own later
        registration then changes nothing); False when the index cannot be reached from here."""
        import socket

        from stoker.client.base import client_db

        v = self._values
        try:
            if client_db().get_run(v["flow_name"], v["run_id"]) is None:  # not a run's task: invent nothing
                return False
            client_db().register_attempt(v["flow_name"], v["run_id"], v["step_name"], v["task_id"],
                                         int(v.get("retry_count") or 0), user=v.get("username"),
                                         hostname=socket.gethostname())
        except Exception:  # noqa: BLE001 - e.g. a remote node without the index: the NotFound stands
            return False
        return True

    @property
    def run(self) -> Any:
        """The client's Run of the running run (None outside a task)."""
        flow, run_id = self._values.get("flow_name"), self._values.get("run_id")
        if flow is None or run_id is None:
            return None
        from stoker.client import Run

        return Run(f"{flow}/{run_id}", _namespace_check=False)

    @property
    def graph(self) -> dict[str, Any]:
        """The flow's graph as Metaflow's `current.graph` has it (file, start/end step, steps with their type,
        decorators and successors); RuntimeError outside a task, as in Metaflow."""
        g = self._values.get("graph")
        if g is None:
            raise RuntimeError("Graph is not available")
        if callable(g):  # built on first use
            g = self._values["graph"] = g()
        return g

    def __repr__(self) -> str:
        return f"current({self.pathspec or 'not in a task'})"


_TYPES = {"split": "split-static", "foreach": "split-foreach", "parallel": "split-parallel",
          "switch": "split-switch"}


def graph_info(graph: Any, doc: str | None = None) -> dict[str, Any]:
    """Metaflow's `_graph_info` of a FlowGraph: what `current.graph` returns in a task."""
    import os

    def step(node: Any) -> dict[str, Any]:
        kind = _TYPES.get(node.kind) or ("start" if node.name == "start" else "join" if node.is_join else node.kind)
        d = {"name": node.name, "type": kind, "line": node.lineno, "source_file": node.file, "doc": node.doc,
             "decorators": [{"name": deco.name, "attributes": dict(getattr(deco, "attributes", {}))}
                            for deco in node.decorators],
             "next": list(node.out_funcs)}
        if kind == "split-foreach":
            d["foreach_artifact"] = node.foreach_var
        elif kind == "split-parallel":
            d["num_parallel"] = node.num_parallel
        elif kind == "split-switch":
            d.update(condition=node.condition, switch_cases=dict(node.switch_cases))
        if node.matching_join:
            d["matching_join"] = node.matching_join
        return d

    return {"file": os.path.basename(graph.file), "start_step": "start", "end_step": "end",
            "steps": {n.name: step(n) for n in graph}, "doc": doc or ""}


current = Current()
