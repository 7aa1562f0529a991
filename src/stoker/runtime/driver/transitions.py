"""What a finished task starts: its successors by the kind of its step (linear, static split, foreach, gang,
switch), the joins it completes, and the passes of recursive switches.

A transition returns the tasks to start (`NewTask`) and the scheduler adds them: nothing here edits the scheduler.
What the transitions of a run keep between tasks (the branches that reached each join so far) is in `Transitions`,
which the scheduler owns.

A switch is not a split: the case the step chose (its manifest's `next`) runs, in the same foreach frames, and
the cases converge on a step without `inputs`, as in Metaflow. A recursive switch (a step whose cases include
itself, Metaflow's one kind of loop) runs one task per pass: entering it adds a pass counter to the task's
`iteration`, going round increments it, leaving drops it. `Task.key` includes it, so a resume clones each pass
of the origin run in order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from stoker.flow.frames import ForeachFrame
from stoker.flow.graph import FlowGraph
from stoker.runtime.driver.queue import Task, frames_key
from stoker.runtime.spec import GangSlot


@dataclass(frozen=True, slots=True)
class NewTask:
    """A task to start: the scheduler makes it a pending `Task`, numbered then unless `task_id` is set (a gang's
    nodes are numbered together, when the gang is formed)."""

    step: str
    inputs: list[Task]  # the tasks whose results it reads (a join's: one per branch, in branch order)
    foreach: list[ForeachFrame]  # the splits it is inside, outermost first
    iteration: tuple = ()  # the pass of each enclosing recursive switch
    parallel: GangSlot | None = None  # a gang node's place in its gang
    gang: str | None = None  # the gang's name (`{step}-{node 0's task id}`)
    task_id: str | None = None


def first_task(graph: FlowGraph) -> NewTask:
    """The run's first task: `start` (in its first pass, when it is a recursive switch)."""
    return NewTask("start", [], [], iteration=(0,) if graph["start"].is_recursive else ())


def chosen_steps(graph: FlowGraph, t: Task) -> list[str]:
    """The steps a finished task goes to: a switch's chosen case, else every step its source names."""
    node = graph[t.step]
    nxt = (t.manifest or {}).get("next") or {}
    if node.kind == "switch":
        steps = nxt.get("steps") or []
        if len(steps) != 1 or steps[0] not in node.out_funcs:  # checked by the task; a manifest is data
            raise ValueError(f"switch step {t.step} (task {t.task_id}) chose {steps}, not one of {node.out_funcs}")
        return steps
    return list(node.out_funcs)


def next_iteration(graph: FlowGraph, t: Task, target: str) -> tuple:
    """The pass counters of a task of `target` started by `t` (Metaflow's loop index)."""
    it = list(t.iteration)
    if graph[t.step].is_recursive and it:
        if target == t.step:
            it[-1] += 1
            return tuple(it)
        it.pop()  # leaving the loop
    if graph[target].is_recursive:
        it.append(0)  # entering one
    return tuple(it)


class Transitions:
    """The transitions of one run. `new_id` numbers a gang's nodes as the gang is formed (the scheduler's
    `TaskIndex.new_id`: the same sequence as every other task's); `gang_nodes(step, n)` is how many nodes a gang of
    `n` gets (a smoke run's cap, distributed/smoke.py; all `n` by default)."""

    def __init__(self, graph: FlowGraph, new_id: Callable[[], str],
                 gang_nodes: Callable[[str, int], int] | None = None) -> None:
        self.graph = graph
        self.new_id = new_id
        self.gang_nodes = gang_nodes or (lambda step, n: n)
        self.joins: dict[tuple, dict[int, Task]] = {}  # (join, outer frames, passes) -> branch index -> its task

    def successors(self, t: Task) -> list[NewTask]:
        """The tasks that `t` (ok, or cloned) starts, and the joins it completes, in the order they are added."""
        node = self.graph[t.step]
        nxt = (t.manifest or {}).get("next") or {}
        if node.kind == "foreach":
            n, var = nxt["num_splits"], nxt["foreach_var"]
            desc = t.manifest["artifacts"][var]
            target = node.out_funcs[0]
            iteration = next_iteration(self.graph, t, target)
            return [NewTask(target, [t], [*t.foreach, ForeachFrame(step=t.step, var=var, index=i, num_splits=n,
                                                                   desc=desc)], iteration) for i in range(n)]
        if node.kind == "parallel":
            target = node.out_funcs[0]
            return self.gang(target, t, self.gang_nodes(target, int(nxt["num_parallel"])))
        out: list[NewTask] = []
        for target in chosen_steps(self.graph, t):
            if self.graph[target].is_join:
                out += self.arrive(target, t)
            else:
                out.append(NewTask(target, [t], list(t.foreach), next_iteration(self.graph, t, target)))
        return out

    def gang(self, step: str, parent: Task, n: int) -> list[NewTask]:
        """A gang of `n` nodes of `step` started by `parent` (the main address and the port come from the engine
        when each node starts)."""
        ids = [self.new_id() for _ in range(n)]
        iteration = next_iteration(self.graph, parent, step)
        return [NewTask(step, [parent], [*parent.foreach, ForeachFrame(step=parent.step, index=i, num_splits=n)],
                        iteration, parallel=slot, gang=f"{step}-{ids[0]}", task_id=ids[i])
                for i, slot in enumerate(GangSlot.gang(n, ids[0]))]

    def arrive(self, join: str, t: Task) -> list[NewTask]:
        """`t` reached `join`: the join, once every branch (every foreach item) of its split has arrived. A static
        split's branch is the one `t`'s step is on: after a switch, any of its cases may arrive."""
        split = self.graph.closing_split(join)
        if split.kind in ("foreach", "parallel"):
            outer, idx, expected = t.foreach[:-1], t.foreach[-1].index, t.foreach[-1].num_splits
        else:
            outer, idx, expected = t.foreach, self.graph.branch_index(t.step, join), len(split.out_funcs)
        bucket = self.joins.setdefault((join, frames_key(outer), tuple(t.iteration)), {})
        bucket[idx] = t
        if len(bucket) != expected:
            return []
        return [NewTask(join, [bucket[i] for i in sorted(bucket)], list(outer), tuple(t.iteration))]
