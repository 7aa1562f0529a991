"""What a finished task starts: its successors by the kind of its step (linear, static split, foreach, gang,
switch), the joins it completes, and the passes of recursive switches.

A switch is not a split: the case the step chose (its manifest's `next`) runs, in the same foreach frames, and
the cases converge on a step without `inputs`, as in Metaflow. A recursive switch (a step whose cases include
itself, Metaflow's one kind of loop) runs one task per pass: entering it adds a pass counter to the task's
`iteration`, going round increments it, leaving drops it. `Task.key` includes it, so a resume clones each pass
of the origin run in order.
"""

from __future__ import annotations

from typing import Any, Protocol

from stoker.distributed.smoke import cap_gang
from stoker.runtime.driver.queue import Task, frames_key


class Scheduler(Protocol):
    """What these functions use of runtime.scheduler.Scheduler (which imports this module, not the reverse)."""

    graph: Any
    store: Any
    flow: str
    run_id: str
    joins: dict
    _next_id: int

    def _add(self, step: str, inputs: list[Task], foreach: list[dict], parallel: dict | None = None,
             gang: str | None = None, task_id: str | None = None, iteration: tuple = ()) -> Task: ...

    def _new_id(self) -> str: ...


def chosen_steps(sched: Scheduler, t: Task) -> list[str]:
    """The steps a finished task goes to: a switch's chosen case, else every step its source names."""
    node = sched.graph[t.step]
    nxt = (t.manifest or {}).get("next") or {}
    if node.kind == "switch":
        steps = nxt.get("steps") or []
        if len(steps) != 1 or steps[0] not in node.out_funcs:  # checked by the task; a manifest is data
            raise ValueError(f"switch step {t.step} (task {t.task_id}) chose {steps}, not one of {node.out_funcs}")
        return steps
    return list(node.out_funcs)


def next_iteration(sched: Scheduler, t: Task, target: str) -> tuple:
    """The pass counters of a task of `target` started by `t` (Metaflow's loop index)."""
    it = list(t.iteration)
    node = sched.graph[t.step]
    if node.is_recursive and it:
        if target == t.step:
            it[-1] += 1
            return tuple(it)
        it.pop()  # leaving the loop
    if sched.graph[target].is_recursive:
        it.append(0)  # entering one
    return tuple(it)


def start_successors(sched: Scheduler, t: Task) -> None:
    """Add the tasks that `t` (ok, or cloned) starts, and the joins it completes."""
    node = sched.graph[t.step]
    nxt = (t.manifest or {}).get("next") or {}
    if node.kind == "foreach":
        n, var = nxt["num_splits"], nxt["foreach_var"]
        desc = t.manifest["artifacts"][var]
        target = node.out_funcs[0]
        for i in range(n):
            sched._add(target, [t], t.foreach + [{"step": t.step, "var": var, "index": i, "num_splits": n,
                                                   "desc": desc}], iteration=next_iteration(sched, t, target))
    elif node.kind == "parallel":
        n = cap_gang(sched.store, sched.flow, sched.run_id, node.out_funcs[0], int(nxt["num_parallel"]))
        add_gang(sched, node.out_funcs[0], t, n)
    else:
        for target in chosen_steps(sched, t):
            if sched.graph[target].is_join:
                arrive(sched, target, t)
            else:
                sched._add(target, [t], list(t.foreach), iteration=next_iteration(sched, t, target))


def add_gang(sched: Scheduler, step: str, parent: Task, n: int) -> None:
    gang = f"{step}-{sched._next_id + 1}"
    ids = [sched._new_id() for _ in range(n)]
    for i in range(n):  # the main address and the port come from the engine when the node starts
        par = {"main_ip": None, "num_nodes": n, "node_index": i, "port": None, "control_task_id": ids[0]}
        sched._add(step, [parent], parent.foreach + [{"step": parent.step, "var": None, "index": i,
                                                      "num_splits": n}], parallel=par, gang=gang, task_id=ids[i],
                   iteration=next_iteration(sched, parent, step))


def arrive(sched: Scheduler, join: str, t: Task) -> None:
    """`t` reached `join`: start the join once every branch (every foreach item) of its split has arrived.
    A static split's branch is the one `t`'s step is on: after a switch, any of its cases may arrive."""
    split = sched.graph.closing_split(join)
    if split.kind in ("foreach", "parallel"):
        outer, idx, expected = t.foreach[:-1], t.foreach[-1]["index"], t.foreach[-1]["num_splits"]
    else:
        outer, idx, expected = t.foreach, sched.graph.branch_index(t.step, join), len(split.out_funcs)
    bucket = sched.joins.setdefault((join, frames_key(outer), tuple(t.iteration)), {})
    bucket[idx] = t
    if len(bucket) == expected:
        sched._add(join, [bucket[i] for i in sorted(bucket)], list(outer), iteration=tuple(t.iteration))
