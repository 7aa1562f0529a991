"""TaskSpec: the small, JSON-serializable description of one task attempt, and GangSlot, a gang node's place in it.

The same spec drives the task entrypoint wherever the task runs (a forked process here, a Slurm job step, a
Batch container); a backend only decides where the command starts. Its typed parts (`ForeachFrame`, `GangSlot`)
become JSON in `TaskSpec.to_dict` and come back in `TaskSpec.from_dict`, and nowhere else.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from stoker.flow.frames import ForeachFrame, frames_from_json, frames_to_json

if TYPE_CHECKING:
    from stoker.store.manifest import Manifest


@dataclass(frozen=True, slots=True, kw_only=True)
class GangSlot:
    """A gang node's place in its gang (`TaskSpec.parallel`; the task's `current.parallel`).

    The driver makes a gang's slots in one place (`GangSlot.gang`): each node's index, the gang's size and its
    control task (node 0's task id). `main_ip` and `port` stay None until the node starts and learns them from its
    engine's environment (`started`, runtime/member/node.py).
    JSON (a unit spec document, `_task SPEC`): ``{"main_ip", "num_nodes", "node_index", "port", "control_task_id"}``
    (`to_dict` / `from_dict`); a manifest keeps ``{"node_index", "num_nodes"}`` of it."""

    main_ip: str | None = None  # the main node's address (rank 0's host), once the node has started
    num_nodes: int  # the gang's size
    node_index: int  # this node, from 0 (the main node)
    port: int | None = None  # the rendezvous port, once the node has started
    control_task_id: str | None = None  # the task id of node 0
    member: int | None = None  # the engine member running this node, when the gang has spares (else its index)
    spares: int = 0  # the gang's hot spares (@torchrun(spares=k)): members beyond num_nodes that wait warm

    @classmethod
    def gang(cls, n: int, control_task_id: str) -> list[GangSlot]:
        """The slots of a gang of `n` nodes whose node 0 is task `control_task_id`."""
        return [cls(num_nodes=n, node_index=i, control_task_id=control_task_id) for i in range(n)]

    def with_spares(self, spares: int, member: int) -> GangSlot:
        """This slot in a gang with `spares` hot spares, run by engine member `member` (distributed/gangboard.py)."""
        return replace(self, spares=spares, member=member)

    def started(self, main_ip: str, port: int | None, num_nodes: int) -> GangSlot:
        """This slot on a node that has started: what its engine says of the gang."""
        return replace(self, main_ip=main_ip, port=port, num_nodes=num_nodes)

    def to_dict(self) -> dict[str, Any]:
        d = {"main_ip": self.main_ip, "num_nodes": self.num_nodes, "node_index": self.node_index,
             "port": self.port, "control_task_id": self.control_task_id}
        if self.spares:  # only a gang with spares has more than these (older readers see what they know)
            d.update(member=self.member, spares=self.spares)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GangSlot:
        return cls(main_ip=d.get("main_ip"), num_nodes=d["num_nodes"], node_index=d["node_index"], port=d.get("port"),
                   control_task_id=d.get("control_task_id"), member=d.get("member"), spares=int(d.get("spares") or 0))


@dataclass(kw_only=True)
class TaskSpec:
    flow: str
    run_id: str
    step: str
    task_id: str
    attempt: int = 0
    max_attempts: int = 1
    inputs: list[dict] = field(default_factory=list)  # [{"step", "task_id", "attempt"}] parent task attempts
    foreach: list[ForeachFrame] = field(default_factory=list)  # the enclosing splits, outermost first
    iteration: list[int] = field(default_factory=list)  # passes of enclosing recursive switches
    parallel: GangSlot | None = None  # a gang node's place in its gang; None outside a gang
    run_inputs: dict[str, dict] = field(default_factory=dict)  # parameter/config name -> artifact descriptor
    user: str = "unknown"
    tags: list[str] = field(default_factory=list)
    origin_run_id: str | None = None
    store_url: str = ""
    flow_file: str = ""
    flow_class: str = ""
    with_decorators: list[str] = field(default_factory=list)  # --with specs, re-applied in the task process
    hang_timeout_s: float | None = None  # run --hang-timeout: gangs' hang timeout (None: the default; 0: off)

    @property
    def pathspec(self) -> str:
        return f"{self.flow}/{self.run_id}/{self.step}/{self.task_id}"

    def input_paths(self) -> list[str]:
        return [f"{self.flow}/{self.run_id}/{i['step']}/{i['task_id']}" for i in self.inputs]

    def manifest_head(self, started_at: float) -> Manifest:
        """The manifest of this attempt as it starts, whoever finishes it (the task, or the scheduler for a task
        that died without writing one): see stoker.store.manifest.Manifest.begin."""
        from stoker.store.manifest import Manifest

        return Manifest.begin(flow=self.flow, run_id=self.run_id, step=self.step, task_id=self.task_id,
                              attempt=self.attempt, started_at=started_at, user=self.user,
                              input_paths=self.input_paths(), foreach=frames_to_json(self.foreach),
                              iteration=self.iteration, parallel=self.parallel.to_dict() if self.parallel else None)

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON holds it (a shallow copy): its frames and gang slot as their dicts."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["foreach"] = frames_to_json(self.foreach)
        d["parallel"] = self.parallel.to_dict() if self.parallel else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TaskSpec:
        """The spec `to_dict` gave (a unit spec document's member, a `_task SPEC` file)."""
        par = d.get("parallel")
        return cls(**{**d, "foreach": frames_from_json(d.get("foreach")),
                      "parallel": GangSlot.from_dict(par) if par else None})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), default=str)

    @classmethod
    def from_json(cls, text: str) -> TaskSpec:
        return cls.from_dict(json.loads(text))
