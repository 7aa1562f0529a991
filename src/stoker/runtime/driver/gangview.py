"""Each node's state of a gang (num_parallel) as one compact line, printed only when the states change:

    [RUN/train] gang of 4 nodes: node 0 running, node 1 running, node 2 queued (Resources), node 3 running

At most one line a second per gang, but the last states of a gang (all nodes ended) always show.
"""

from __future__ import annotations

import time
from typing import Any

from stoker.runtime.driver.lostnodes import lost_why

ENDED = ("done", "failed", "killed", "lost")
MIN_GAP_S = 1.0


def node_states(tasks: list[Any], ref: Any, status: Any) -> list[str]:
    """The state of each node of the gang job ``ref``: queued (why) / running / stopping / done / failed / lost (its
    heartbeat stopped: runtime/driver/lostnodes.py) / killed, from the scheduler's tasks and the engine's member
    statuses."""
    out = []
    for t in tasks:
        if t.state == "ok":
            out.append("done")
        elif t.state != "running" or t.job is not ref:
            out.append("lost" if t.state == "failed" and lost_why(t) else t.state)  # or killed, or pending again
        elif t.stopping:
            out.append("stopping")
        else:
            s = status.member(t.member)
            queued = s.state == "queued" and not s.started_at
            out.append(("queued" + (f" ({s.reason})" if s.reason else "")) if queued else "running")
    return out


class GangView:
    """Remembers what was last shown for each gang job and decides when to show a new line."""

    def __init__(self, min_gap: float = MIN_GAP_S) -> None:
        self.min_gap = min_gap
        self.shown: dict[Any, tuple[list[str], float]] = {}

    def line(self, key: Any, label: str, states: list[str], now: float | None = None) -> str | None:
        """The line to print for these states, or None: unchanged, or the last line is under a second old
        (the change then shows on a later call) unless every node has ended."""
        now = time.time() if now is None else now
        last, at = self.shown.get(key, (None, float("-inf")))
        ended = all(s in ENDED for s in states)
        if ended:
            self.shown.pop(key, None)  # the gang job is over: nothing more to remember
        if states == last or (not ended and now - at < self.min_gap):
            return None
        if not ended:
            self.shown[key] = (list(states), now)
        return f"[{label}] gang of {len(states)} nodes: " + ", ".join(f"node {i} {s}" for i, s in enumerate(states))
