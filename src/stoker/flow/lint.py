"""Structural checks of a FlowGraph: every problem is reported as (file:line, message with the fix)."""

from __future__ import annotations

from typing import Any

from stoker.errors import GraphError
from stoker.flow.graph import RESERVED, FlowGraph, StepNode


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
        if node.is_join and node.kind in ("split", "foreach", "parallel", "switch"):
            add(node, f"step {node.name} is both a join (it takes inputs) and a {node.kind} (its self.next() "
                      f"starts new branches); as in Metaflow this is not allowed: end the join with "
                      f"self.next(self.<step>) and split in that step")
        if node.kind == "switch" and len(node.switch_cases) < 2:
            add(node, f"step {node.name} is a switch with {len(node.switch_cases)} case; a switch needs at least "
                      f"2 cases (use self.next(self.<step>) for one)", node.next_lineno)
        catch = next((d for d in node.decorators if getattr(d, "name", "") == "catch"), None)
        if catch is not None and node.kind == "switch":
            add(node, f"@catch is not supported on step {node.name}, a {node.kind} step (as in Metaflow): move the "
                      f"work that may fail to a step before it")
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
        add(first, f"steps form a loop ({' -> '.join(cycle)}); a flow is acyclic: use foreach= to repeat work, "
                   f"or a switch that goes back to its own step "
                   f"(self.next({{\"again\": self.{first.name}, \"done\": self.<next>}}, condition=...))")
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
            if t == n and graph.nodes[n].kind == "switch":
                continue  # a recursive switch: Metaflow's one kind of loop
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
    """Assign split_parents / split_branches / matching_join in topological order; check that splits and joins
    pair up. A switch is not a split: its cases converge on a step without inputs (as in Metaflow)."""
    nodes = graph.nodes
    out: list[tuple[str, str]] = []

    def parents_of(name: str) -> list[str]:  # a recursive switch's edge to itself is not an input
        return [p for p in nodes[name].in_funcs if p in reachable and p != name]

    indeg = {n: len(parents_of(n)) for n in reachable}
    ready = [n for n in sorted(reachable, key=lambda n: n != "start") if indeg[n] == 0]
    # what a step passes to each child: [(split, branch)] of the splits it is inside
    edge: dict[tuple[str, str], list[tuple[str, str]]] = {}
    while ready:
        name = ready.pop(0)
        node = nodes[name]
        parents = parents_of(name)
        stacks = [edge[(p, name)] for p in parents]
        base: list[tuple[str, str]] = list(stacks[0]) if stacks else []
        if node.is_join:
            switches = [p for p in parents if nodes[p].kind == "switch"]
            if switches:
                out.append((node.where(), f"join {name} follows the switch in {', '.join(switches)} directly: a "
                                          f"conditional path cannot lead straight to a join (as in Metaflow); add "
                                          f"a step without inputs on that path before the join"))
            if not parents or any(not s for s in stacks):
                out.append((node.where(), f"step {name} is a join (takes inputs) but does not follow a split: "
                                          f"remove `inputs` or split before it"))
                base = []
            elif any([x for x, _ in s] != [x for x, _ in stacks[0]] for s in stacks):
                tops = sorted({s[-1][0] for s in stacks})
                out.append((node.where(), f"join {name} joins branches of different splits ({', '.join(tops)}): "
                                          f"join each split's branches separately"))
                base = stacks[0][:-1]
            else:
                split = nodes[stacks[0][-1][0]]
                node.split_parents = [x for x, _ in stacks[0]]
                node.split_branches = [b for _, b in stacks[0]]
                if split.matching_join and split.matching_join != name:
                    out.append((node.where(), f"branches of {split.name} end in two joins, {split.matching_join} "
                                              f"and {name}: send all branches to one join"))
                split.matching_join = name
                arrived = {s[-1][1] for s in stacks}
                if split.kind == "split" and arrived != set(split.out_funcs):
                    out.append((node.where(), f"join {name} receives {len(arrived)} of the {len(split.out_funcs)} "
                                              f"branches of {split.name}: send every branch to it"))
                base = stacks[0][:-1]
        else:
            if any(s != stacks[0] for s in stacks):
                out.append((node.where(), f"step {name} has several parents ({', '.join(parents)}) but takes no "
                                          f"inputs: make it a join, `def {name}(self, inputs)`"))
            node.split_parents = [x for x, _ in base]
            node.split_branches = [b for _, b in base]
        if node.kind == "parallel" and node.out_funcs:
            gang = nodes.get(node.out_funcs[0])
            if gang and not (gang.out_funcs and gang.out_funcs[0] in nodes and nodes[gang.out_funcs[0]].is_join):
                out.append((gang.where(), f"gang step {gang.name} must be followed by a join step "
                                          f"(`def join(self, inputs)`)"))
        if name == "end" and base:
            out.append((node.where(), f"step end is reached inside the split in {base[-1][0]}: join its branches "
                                      f"with a step that takes inputs before end"))
        splits = node.kind in ("split", "foreach", "parallel")
        for t in node.out_funcs:
            if t in indeg and t != name:
                edge[(name, t)] = base + [(name, t)] if splits else base
                if edge[(name, t)]:
                    graph.edge_branch[(name, t)] = edge[(name, t)][-1][1]
                indeg[t] -= 1
                if indeg[t] == 0:
                    ready.append(t)
    return out


def lint(graph: FlowGraph, parameters: dict[str, Any] | None = None) -> None:
    """Raise one GraphError listing every problem, each with file:line and the fix."""
    problems = collect_problems(graph, parameters or {})
    if problems:
        lines = [f"{where}: {msg}" for where, msg in problems]
        raise GraphError(f"flow {graph.name} is not valid ({len(lines)} problem"
                         f"{'s' if len(lines) > 1 else ''}):\n  " + "\n  ".join(lines))
