"""Structural checks of a FlowGraph: every problem is reported as (file:line, message with the fix)."""

from __future__ import annotations

from typing import Any

from .graph import RESERVED, FlowGraph, StepNode


def collect_problems(graph: FlowGraph, parameters: dict[str, Any]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    nodes = graph.nodes

    def add(node: StepNode | None, msg: str, lineno: int | None = None) -> None:
        out.append((node.where(lineno) if node else f"{graph.file}:{graph.lineno}", msg))

    if "start" not in nodes:
        add(None, f"flow {graph.name} has no start step: add `@step def start(self)` as the first step")
    if "end" not in nodes:
        add(None, f"flow {graph.name} has no end step: add `@step def end(self)` as the last step")
    for node in nodes.values():
        for lineno, msg in node.problems:
            add(node, msg, lineno)
        if node.name in RESERVED:
            add(node, f"step name {node.name!r} is reserved by FlowSpec; rename the step")
        if node.name in parameters or node.name in {getattr(p, "name", None) for p in parameters.values()}:
            add(node, f"step {node.name} has the same name as a parameter; rename one of them")
        if node.num_args not in (1, 2):
            add(node, f"step {node.name} takes {node.num_args} arguments; a step takes (self), a join (self, inputs)")
        if node.name == "start" and node.is_join:
            add(node, "the start step cannot be a join: define it as `def start(self)`")
        for target in node.out_funcs:
            if target not in nodes:
                hint = f" (did you mean self.{_closest(target, nodes)}?)" if _closest(target, nodes) else ""
                add(node, f"step {node.name} goes to self.{target}, which is not a step{hint}: "
                          f"define it with @step or fix the name", node.next_lineno)
        if node.kind == "foreach" and node.foreach_var and node.foreach_var not in graph.assigned \
                and node.foreach_var not in parameters and node.foreach_var not in graph.class_attrs:
            add(node, f"foreach={node.foreach_var!r} names an artifact that no step assigns: "
                      f"set self.{node.foreach_var} = [...] before self.next()", node.next_lineno)
        if node.kind == "parallel":
            n = node.num_parallel
            if isinstance(n, (int, float)) and not isinstance(n, bool) and n < 1:
                add(node, f"num_parallel={n} must be at least 1", node.next_lineno)
            for t in node.out_funcs:
                if t in nodes and not nodes[t].is_gang:
                    add(nodes[t], f"step {t} is started with num_parallel= but has no @parallel or @torchrun: "
                                  f"add @parallel above @step")
        if node.is_gang and not any(nodes[p].kind == "parallel" for p in node.in_funcs if p in nodes) \
                and node.in_funcs:
            add(node, f"step {node.name} is a @parallel/@torchrun step but is not started with num_parallel=: "
                      f"use self.next(self.{node.name}, num_parallel=N) in the step before it")
    if out:
        return out  # structure checks below need sane nodes
    cycle = _find_cycle(graph)
    if cycle:
        first = nodes[cycle[0]]
        add(first, f"steps form a loop ({' -> '.join(cycle)}); a flow is acyclic: use foreach= to repeat work")
        return out
    reachable = graph.reachable_from("start")
    for node in nodes.values():
        if node.name not in reachable:
            add(node, f"step {node.name} is unreachable from start: call self.next(self.{node.name}) "
                      f"from a step or delete it")
    out.extend(_check_splits(graph, reachable))
    return out


def _closest(name: str, nodes: dict) -> str | None:
    import difflib

    m = difflib.get_close_matches(name, list(nodes), n=1)
    return m[0] if m else None


def _find_cycle(graph: FlowGraph) -> list[str] | None:
    color: dict[str, int] = {}
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        color[n] = 1
        path.append(n)
        for t in graph.nodes[n].out_funcs:
            if color.get(t) == 1:
                return path[path.index(t):] + [t]
            if t not in color:
                found = visit(t)
                if found:
                    return found
        path.pop()
        color[n] = 2
        return None

    for n in graph.nodes:
        if n not in color:
            found = visit(n)
            if found:
                return found
    return None


def _check_splits(graph: FlowGraph, reachable: set[str]) -> list[tuple[str, str]]:
    """Assign split_parents / matching_join in topological order and check that splits and joins pair up."""
    nodes = graph.nodes
    out: list[tuple[str, str]] = []
    indeg = {n: sum(1 for p in nodes[n].in_funcs if p in reachable) for n in reachable}
    ready = [n for n in reachable if indeg[n] == 0]
    out_stack: dict[str, list[str]] = {}
    while ready:
        name = ready.pop(0)
        node = nodes[name]
        parents = [p for p in node.in_funcs if p in reachable]
        stacks = [out_stack[p] for p in parents]
        if node.is_join:
            if not parents or any(not s for s in stacks):
                out.append((node.where(), f"step {name} is a join (takes inputs) but does not follow a split: "
                                          f"remove `inputs` or split before it"))
                base: list[str] = []
            elif any(s != stacks[0] for s in stacks):
                tops = sorted({s[-1] for s in stacks})
                out.append((node.where(), f"join {name} joins branches of different splits ({', '.join(tops)}): "
                                          f"join each split's branches separately"))
                base = stacks[0][:-1]
            else:
                node.split_parents = list(stacks[0])
                split = nodes[stacks[0][-1]]
                if split.matching_join and split.matching_join != name:
                    out.append((node.where(), f"branches of {split.name} end in two joins, {split.matching_join} "
                                              f"and {name}: send all branches to one join"))
                split.matching_join = name
                if split.kind in ("foreach", "parallel") and len(parents) != 1:
                    out.append((node.where(), f"join {name} closes the {split.kind} in {split.name} and must have "
                                              f"one parent, not {len(parents)}"))
                if split.kind == "split" and len(parents) != len(split.out_funcs):
                    out.append((node.where(), f"join {name} receives {len(parents)} of the {len(split.out_funcs)} "
                                              f"branches of {split.name}: send every branch to it"))
                base = stacks[0][:-1]
        else:
            if len(parents) > 1:
                out.append((node.where(), f"step {name} has several parents ({', '.join(parents)}) but takes no "
                                          f"inputs: make it a join, `def {name}(self, inputs)`"))
            base = list(stacks[0]) if stacks else []
            node.split_parents = base
        if node.kind == "parallel" and node.out_funcs:
            gang = nodes.get(node.out_funcs[0])
            if gang and not (gang.out_funcs and gang.out_funcs[0] in nodes and nodes[gang.out_funcs[0]].is_join):
                out.append((gang.where(), f"gang step {gang.name} must be followed by a join step "
                                          f"(`def join(self, inputs)`)"))
        if name == "end" and base:
            out.append((node.where(), f"step end is reached inside the split in {base[-1]}: join its branches "
                                      f"with a step that takes inputs before end"))
        out_stack[name] = base + [name] if node.kind in ("split", "foreach", "parallel") else base
        for t in node.out_funcs:
            if t in indeg:
                indeg[t] -= 1
                if indeg[t] == 0:
                    ready.append(t)
    return out
