"""TaskSpec: the small, JSON-serializable description of one task attempt.

The same spec drives the task entrypoint wherever the task runs (a forked process here, a Slurm job step, a
Batch container); a backend only decides where the command starts.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(kw_only=True)
class TaskSpec:
    flow: str
    run_id: str
    step: str
    task_id: str
    attempt: int = 0
    max_attempts: int = 1
    inputs: list[dict] = field(default_factory=list)  # [{"step", "task_id", "attempt"}] parent task attempts
    foreach: list[dict] = field(default_factory=list)  # frames: {"step", "var", "index", "num_splits", "desc"}
    iteration: list[int] = field(default_factory=list)  # passes of enclosing recursive switches
    parallel: dict | None = None  # {"main_ip", "num_nodes", "node_index", "port", "control_task_id"}
    run_inputs: dict[str, dict] = field(default_factory=dict)  # parameter/config name -> artifact descriptor
    user: str = "unknown"
    tags: list[str] = field(default_factory=list)
    origin_run_id: str | None = None
    store_url: str = ""
    flow_file: str = ""
    flow_class: str = ""
    with_decorators: list[str] = field(default_factory=list)  # --with specs, re-applied in the task process

    @property
    def pathspec(self) -> str:
        return f"{self.flow}/{self.run_id}/{self.step}/{self.task_id}"

    def input_paths(self) -> list[str]:
        return [f"{self.flow}/{self.run_id}/{i['step']}/{i['task_id']}" for i in self.inputs]

    def manifest_head(self, started_at: float) -> dict[str, Any]:
        """The fields every manifest of this attempt has, whoever writes it (the task, or the scheduler for a
        task that died without writing one)."""
        import socket

        from stoker.store.manifest import log_name

        par = self.parallel
        return {
            "flow": self.flow, "run_id": self.run_id, "step": self.step, "task_id": self.task_id,
            "attempt": self.attempt, "retry_count": self.attempt, "started_at": started_at, "user": self.user,
            "hostname": socket.gethostname(), "origin_task": None, "catch_var": None,
            "input_paths": self.input_paths(),
            "foreach_stack": [{k: f.get(k) for k in ("step", "var", "index", "num_splits", "desc")}
                              for f in self.foreach],
            "iteration": list(self.iteration),
            "parallel": {"node_index": par["node_index"], "num_nodes": par["num_nodes"]} if par else None,
            "logs": {s: log_name(self.flow, self.run_id, self.step, self.task_id, self.attempt, s)
                     for s in ("stdout", "stderr")},
        }

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=str)

    @classmethod
    def from_json(cls, text: str) -> TaskSpec:
        return cls(**json.loads(text))
