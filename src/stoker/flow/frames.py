"""`ForeachFrame`: one split a task is inside (a foreach's item, or a node of a `num_parallel` gang).

The driver builds a task's frames when a split starts it (runtime/driver/transitions.py), its TaskSpec carries them
to wherever the task runs, its manifest keeps them (`foreach_stack`), and the task gives each a way to load its item
(`with_value`) for `self.input`, `self.index` and `self.foreach_stack()` (flow/spec.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class ForeachFrame:
    """One enclosing split of a task; a task's frames are a list, outermost first.

    JSON (a TaskSpec's `foreach`, a manifest's `foreach_stack`; `to_dict` / `from_dict`, nowhere else):
    ``{"step", "var", "index", "num_splits", "desc"}``. A gang node's frame has ``var`` and ``desc`` None."""

    step: str  # the step that split (a foreach, or the step before a gang)
    index: int  # which item (node) this task handles, from 0
    num_splits: int  # how many items (nodes) the split made
    var: str | None = None  # the foreach's artifact (`foreach="var"`); None for a gang node
    desc: dict | None = None  # that artifact's descriptor (the task loads its item from it); None for a gang node
    # in a task only, never serialized: loads this frame's item (runtime/member/task.py sets it, `with_value`)
    value_fn: Callable[[], Any] | None = field(default=None, compare=False, repr=False)

    @property
    def is_gang(self) -> bool:
        """A node of a `num_parallel` gang: as in Metaflow, its item is the node index and it has no split count."""
        return self.var is None and self.desc is None

    def with_value(self, value_fn: Callable[[], Any]) -> ForeachFrame:
        return replace(self, value_fn=value_fn)

    def value(self) -> Any:
        """`self.input` of a task in this frame: its item (a gang node: its index; None when it cannot be loaded)."""
        if self.is_gang:
            return self.index
        return self.value_fn() if self.value_fn is not None else None

    def stack_entry(self) -> tuple[int, int | None, Any]:
        """`(index, num_splits, value)`, as `FlowSpec.foreach_stack()` lists it (a gang node: no split count)."""
        return (self.index, None if self.is_gang else self.num_splits, self.value())

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "var": self.var, "index": self.index, "num_splits": self.num_splits,
                "desc": self.desc}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ForeachFrame:
        """A frame from its JSON (keys it does not know, e.g. an older manifest's, are ignored; `desc` may lack)."""
        return cls(step=d["step"], var=d.get("var"), index=d["index"], num_splits=d["num_splits"], desc=d.get("desc"))


def frames_from_json(stack: Iterable[dict[str, Any]] | None) -> list[ForeachFrame]:
    """The frames of a TaskSpec's `foreach` or a manifest's `foreach_stack`, as stored."""
    return [ForeachFrame.from_dict(f) for f in stack or ()]


def frames_to_json(frames: Iterable[ForeachFrame]) -> list[dict[str, Any]]:
    return [f.to_dict() for f in frames]
