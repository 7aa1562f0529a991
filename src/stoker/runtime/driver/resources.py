"""Local admission control: explicit @resources requests are counted against this machine's capacity."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

KEYS = ("cpu", "memory", "gpu")  # what a task's requests are counted in (runtime.jobs.node_need)


@dataclass
class ResourcePool:
    capacity: dict[str, float]
    used: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_capabilities(cls, caps: Any) -> ResourcePool:
        return cls({"cpu": float(caps.cpus), "memory": float(caps.memory_mb), "gpu": float(caps.gpus)})

    def fits(self, needs: list[dict[str, float]]) -> bool:
        for k in KEYS:
            want = sum(n.get(k, 0.0) for n in needs)
            # A request larger than the machine is admitted alone (clamped), never deadlocked.
            if want and self.used.get(k, 0.0) + want > self.capacity.get(k, 0.0):
                return False
        return True

    def take(self, need: dict[str, float]) -> None:
        for k, v in need.items():
            self.used[k] = self.used.get(k, 0.0) + v

    def give(self, need: dict[str, float]) -> None:
        for k, v in need.items():
            self.used[k] = max(0.0, self.used.get(k, 0.0) - v)
