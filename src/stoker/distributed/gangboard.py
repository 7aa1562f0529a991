"""A gang with hot spares (`@torchrun(spares=k)`): its generations, as the driver and the node agents share them.

A gang of N nodes with k spares is one engine job of N + k *members* (processes on nodes: local processes, Slurm
nodes, Batch nodes). Its N tasks are *slots* (node_index 0..N-1, the tasks the join sees); a *generation* says which
member runs each slot. Generation 0 is the first N members (on AWS Batch, members 1..N: the main node is kept as the
last spare, backends/aws); the others wait warm (runtime/member/standby.py). When an active member is lost, the
driver (runtime/driver/spares.py) posts the next generation: the lost member's slot goes to a live spare, the others
keep theirs. The survivors' launcher (distributed/generations.py) ends its torchrun and starts the next one on the
new rendezvous (the host of slot 0's member, on the base port + 1 + the generation's number, so a lost rendezvous
host or a port held by a dead agent never blocks it); training resumes from its last committed checkpoint. The spare
runs the slot's task from its start, as the task's same attempt.

The objects, under the gang's attempt (`runs/<flow>/<run>/<step>/<node 0's task>/<attempt>/gang/`):
    current.json        the latest generation (members poll it)
    gen-000001.json     each generation as it was decided: slots, which member left and why, which spare joined
    member-3.json       member 3's address and host, written when it starts (a spare rewrites it while it waits)
    warm.json           what the spares prepare while they wait: the staged inputs, the Neuron compile cache
    started-000001.json when generation 1's first training step was done (its recovery time ends there)
    evict-000001.json   generation 1's trainer asks for its straggler node to be swapped for a spare
    failed-000001-2.json  member 2's torchrun of generation 1 failed (a peer left): less silence proves a loss
    fault-2.json        member 2 left: its own workers were killed by SIGKILL or SIGBUS (a node fault)
    end.json            the gang is over (`done` or `stopped`): waiting spares exit
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from stoker.store.manifest import attempt_prefix

POLL_S = 0.5  # how often a node agent reads current.json (a GET of ~200 bytes)
FOLDER_POLL_S = 0.2  # ... when the store is a shared folder (a read of a small file)


def poll_interval(store: Any) -> float:
    """How often a node agent reads its gang's generation in `store` (a BlobStore)."""
    return FOLDER_POLL_S if getattr(store, "root", None) is not None else POLL_S


def gang_prefix(flow: str, run_id: str, step: str, control_task_id: str, attempt: int) -> str:
    """The folder of a gang attempt's generation objects."""
    return attempt_prefix(flow, run_id, step, control_task_id, attempt) + "gang/"


def first_slots(num_nodes: int, spares: int, main_is_spare: bool = False) -> list[int]:
    """Generation 0's member of each slot: members 0..N-1, or 1..N when the engine's main node is kept as a spare."""
    start = 1 if main_is_spare and spares > 0 else 0
    return list(range(start, start + num_nodes))


@dataclass(frozen=True)
class Generation:
    """Which member runs each slot from this generation on, and why it changed."""

    gen: int
    slots: list[int]  # slots[i]: the member that runs node i (task i of the gang)
    decided_at: float = field(default_factory=time.time)
    lost: dict[str, Any] | None = None  # {"slot", "member", "host", "why", "last_beat"} of the member that left
    joined: int | None = None  # the spare that took its slot

    def slot_of(self, member: int) -> int | None:
        return self.slots.index(member) if member in self.slots else None

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Generation:
        d = json.loads(data)
        return cls(gen=int(d["gen"]), slots=[int(m) for m in d["slots"]], decided_at=float(d.get("decided_at") or 0),
                   lost=d.get("lost"), joined=d.get("joined"))


class GangBoard:
    """The generation objects of one gang attempt in the store (see the module docstring)."""

    def __init__(self, store: Any, prefix: str) -> None:
        self.store, self.prefix = store, prefix

    @classmethod
    def of(cls, store: Any, flow: str, run_id: str, step: str, control_task_id: str, attempt: int) -> GangBoard:
        return cls(store, gang_prefix(flow, run_id, step, control_task_id, attempt))

    def _read(self, name: str) -> bytes | None:
        try:
            return self.store.read(self.prefix + name) if self.store.exists(self.prefix + name) else None
        except Exception:  # noqa: BLE001 - a store blip: as if not there yet; the caller polls again
            return None

    def _write(self, name: str, doc: dict[str, Any] | bytes) -> None:
        data = doc if isinstance(doc, bytes) else json.dumps(doc, sort_keys=True).encode()
        self.store.write(self.prefix + name, data, durable=False)

    # -- generations ---------------------------------------------------------------------------------------------
    def current(self) -> Generation | None:
        data = self._read("current.json")
        try:
            return Generation.from_json(data) if data else None
        except (ValueError, KeyError, TypeError):
            return None

    def generation(self, number: int) -> Generation | None:
        data = self._read(f"gen-{number:06d}.json")
        try:
            return Generation.from_json(data) if data else None
        except (ValueError, KeyError, TypeError):
            return None

    def post(self, gen: Generation) -> None:
        """Record a generation, then make it the current one (members act on current.json only)."""
        self._write(f"gen-{gen.gen:06d}.json", gen.to_json())
        self._write("current.json", gen.to_json())

    def history(self) -> list[Generation]:
        out = []
        for name in sorted(self.store.list(self.prefix + "gen-")):
            try:
                out.append(Generation.from_json(self.store.read(name)))
            except (ValueError, KeyError, TypeError, OSError):
                continue
        return sorted(out, key=lambda g: g.gen)

    def mark_started(self, gen: int, at: float) -> None:
        """Generation `gen` did its first training step at `at` (its node 0 says so, once)."""
        self._write(f"started-{gen:06d}.json", {"gen": gen, "first_step_at": at})

    def started(self, gen: int) -> float | None:
        data = self._read(f"started-{gen:06d}.json")
        try:
            return float(json.loads(data)["first_step_at"]) if data else None
        except (ValueError, KeyError, TypeError):
            return None

    def request_eviction(self, gen: int, doc: dict[str, Any]) -> None:
        """Generation `gen`'s node 0 asks for a straggler node (`doc["node"]`) to be swapped for a spare: its trainer
        named it and has just saved a checkpoint (`@torchrun(evict_stragglers=True)`)."""
        self._write(f"evict-{gen:06d}.json", doc)

    def eviction(self, gen: int) -> dict[str, Any] | None:
        data = self._read(f"evict-{gen:06d}.json")
        try:
            return json.loads(data) if data else None
        except ValueError:
            return None

    def report_failure(self, member: int, gen: int) -> None:
        """Member `member`'s torchrun of generation `gen` failed (a peer left its collectives, most likely): the
        driver then needs less silence to call the silent node lost."""
        self._write(f"failed-{gen:06d}-{member}.json", {"member": member, "gen": gen, "at": time.time()})

    def report_fault(self, member: int, gen: int, why: str) -> None:
        """Member `member` leaves generation `gen`: its own workers died of a node fault (`why`)."""
        self._write(f"fault-{member}.json", {"member": member, "gen": gen, "why": why, "at": time.time()})

    def fault(self, member: int) -> dict[str, Any] | None:
        data = self._read(f"fault-{member}.json")
        try:
            return json.loads(data) if data else None
        except ValueError:
            return None

    def failures(self, gen: int) -> dict[int, float]:
        """member -> when it reported its torchrun of generation `gen` failed."""
        out = {}
        for name in self.store.list(f"{self.prefix}failed-{gen:06d}-"):
            try:
                doc = json.loads(self.store.read(name))
                out[int(doc["member"])] = float(doc["at"])
            except (ValueError, KeyError, TypeError, OSError):
                continue
        return out

    def publish_warmup(self, doc: dict[str, Any]) -> None:
        """What a spare prepares while it waits, as node 0 of generation 0 did it: the store URLs it staged
        (`stage`), the Neuron compile cache's store and prefix (`neuron_cache`, `store_url`)."""
        self._write("warm.json", doc)

    def warmup(self) -> dict[str, Any] | None:
        data = self._read("warm.json")
        try:
            return json.loads(data) if data else None
        except ValueError:
            return None

    # -- members -------------------------------------------------------------------------------------------------
    def announce(self, member: int, addr: str, host: str, state: str, why: str | None = None) -> None:
        """Member `member` is up at `addr` (`standby`: a spare waiting; `active`: running a slot; `unfit`: a spare
        whose preflight checks failed, `why`: never given a slot)."""
        self._write(f"member-{member}.json", {"member": member, "addr": addr, "host": host, "state": state,
                                               "at": time.time(), **({"why": why} if why else {})})

    def member(self, member: int) -> dict[str, Any] | None:
        data = self._read(f"member-{member}.json")
        try:
            return json.loads(data) if data else None
        except ValueError:
            return None

    # -- the end -------------------------------------------------------------------------------------------------
    def end(self, state: str) -> None:
        self._write("end.json", {"state": state, "at": time.time()})

    def ended(self) -> str | None:
        data = self._read("end.json")
        try:
            return str(json.loads(data)["state"]) if data else None
        except (ValueError, KeyError):
            return None
