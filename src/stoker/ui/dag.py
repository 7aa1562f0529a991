"""The DAG of a run for the run page: which steps follow which, and a layered layout.

The graph comes from the flow file named in the run record, read as text with `ast` (never imported: the
UI runs no user code), so steps that have not started yet show too. When the file is not here (a run made
on another machine) the edges come from the tasks' manifests (`input_paths`), which cover the steps that ran.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any


def _is_step(dec: ast.expr) -> bool:
    target = dec.func if isinstance(dec, ast.Call) else dec
    return (isinstance(target, ast.Name) and target.id == "step") or \
        (isinstance(target, ast.Attribute) and target.attr == "step")


def edges_from_source(path: str | None, flow: str) -> dict[str, list[str]] | None:
    """``{step: [next steps]}`` of class ``flow`` in the file at ``path``, or None if it cannot be read."""
    if not path:
        return None
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    cls = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == flow), None)
    if cls is None:
        return None
    out: dict[str, list[str]] = {}
    for fn in cls.body:
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or not any(map(_is_step, fn.decorator_list)):
            continue
        nexts: list[str] = []
        for call in ast.walk(fn):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "next":
                for arg in call.args:
                    if isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name) and arg.value.id == "self":
                        if arg.attr not in nexts:
                            nexts.append(arg.attr)
        out[fn.name] = nexts
    return out or None


def edges_from_manifests(manifests: list[dict[str, Any]]) -> dict[str, list[str]]:
    """``{step: [next steps]}`` seen in the manifests' input paths (``Flow/run/step/task``)."""
    out: dict[str, list[str]] = {}
    for m in manifests:
        out.setdefault(m["step"], [])
        for parent in m.get("input_paths") or []:
            parts = str(parent).split("/")
            if len(parts) >= 3:
                nexts = out.setdefault(parts[2], [])
                if m["step"] not in nexts:
                    nexts.append(m["step"])
    return out


def layout(edges: dict[str, list[str]], states: dict[str, str]) -> dict[str, Any]:
    """Nodes with a layer (longest path from a root) and a slot within it, and the edges."""
    names = list(edges)
    for nexts in list(edges.values()):
        names += [n for n in nexts if n not in names]
    parents: dict[str, list[str]] = {n: [] for n in names}
    for a, nexts in edges.items():
        for b in nexts:
            parents[b].append(a)
    layer: dict[str, int] = {}

    def depth(n: str, seen: frozenset[str] = frozenset()) -> int:
        if n not in layer:
            ps = [p for p in parents[n] if p not in seen]  # a cycle (never in a valid flow) cannot recurse forever
            layer[n] = 1 + max((depth(p, seen | {n}) for p in ps), default=-1)
        return layer[n]

    for n in names:
        depth(n)
    slots: dict[int, int] = {}
    nodes = []
    for n in sorted(names, key=lambda n: (layer[n], names.index(n))):
        slot = slots.get(layer[n], 0)
        slots[layer[n]] = slot + 1
        nodes.append({"name": n, "layer": layer[n], "slot": slot, "state": states.get(n, "pending")})
    return {"nodes": nodes, "edges": [[a, b] for a, nexts in edges.items() for b in nexts],
            "layers": 1 + max(layer.values(), default=-1), "width": max(slots.values(), default=0)}
