"""What a backend gives the scheduler: launch a task attempt as a process-like handle, poll it, stop it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from ..runtime.spec import TaskSpec


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


class TaskHandle(ABC):
    """A running task attempt. `fds` are readable pipes of (stdout, stderr) or () when logs come otherwise."""

    fds: tuple[int, ...] = ()
    pid: int = 0
    exit_fd: int | None = None  # readable when the task exits (a pidfd on Linux), so the scheduler wakes at once

    @abstractmethod
    def poll(self) -> int | None:
        """Exit code when finished (negative: killed by that signal), else None."""

    @abstractmethod
    def signal(self, sig: int, tree: bool = True) -> None:
        """Send a signal to the whole task: its process group and, with tree=True, all its descendants."""


class Executor(ABC):
    name = "base"

    @abstractmethod
    def capabilities(self) -> Capabilities: ...

    @abstractmethod
    def launch(self, spec: TaskSpec, env: dict[str, str], entry: Callable[[], int]) -> TaskHandle:
        """Start one task attempt. `entry` runs the task in-process (used by forking executors)."""
