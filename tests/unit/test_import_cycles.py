"""The house has no import circles: an AST scan of every module under src/stoker, counting module-level and
function-level imports of stoker modules (``from stoker.x import y``, ``import stoker.x``, relative imports),
must find no cycle between modules."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The stoker modules ``path`` imports anywhere in it (``from pkg import name`` counts ``pkg.name`` when
    that is a module, else ``pkg``)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                root = ".".join(base + ([node.module] if node.module else []))
            else:
                root = node.module or ""
            names = [f"{root}.{a.name}" if f"{root}.{a.name}" in modules else root for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:  # import stoker.a.b.c of a package: its nearest module
                name = name.rpartition(".")[0]
            if name.startswith("stoker") and name != me:
                found.add(name)
    return found


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def package_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Without the edges from a package's ``__init__`` to its own modules: re-exporting is not a circle
    (``stoker.store`` importing ``stoker.store.blobs`` while blob imports ``stoker.store.paths``)."""
    return {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in graph.items()}


def test_no_import_circles():
    files = sorted((SRC / "stoker").rglob("*.py"))
    modules = {module_name(f) for f in files}
    graph = package_edges({module_name(f): imports(f, modules) for f in files})
    cycles = [c for c in find_cycles(graph) ]
    assert not cycles, "import circles (make each one-way or merge the files): " + "; ".join(
        " <-> ".join(c) for c in cycles)


def test_the_scan_finds_a_circle(tmp_path):
    graph = {"stoker.a": {"stoker.b"}, "stoker.b": {"stoker.c"}, "stoker.c": {"stoker.a"}, "stoker.d": {"stoker.a"}}
    assert find_cycles(graph) == [["stoker.a", "stoker.b", "stoker.c"]]


# what each layer must never import (DESIGN.md, "Layers": imports point one way, down)
FORBIDDEN = {
    "stoker.store": ("stoker.client", "stoker.runtime", "stoker.cli", "stoker.ui", "stoker.backends",
                     "stoker.flow", "stoker.features", "stoker.train", "stoker.data", "stoker.monitor"),
    "stoker.store.objects": ("stoker.store.blobs", "stoker.store.artifacts", "stoker.store.manifest",
                             "stoker.store.metadata", "stoker.store.signing"),
    "stoker.client": ("stoker.runtime", "stoker.cli", "stoker.ui", "stoker.backends", "stoker.flow",
                      "stoker.features"),
}


def test_the_store_and_the_client_import_only_downwards():
    files = sorted((SRC / "stoker").rglob("*.py"))
    modules = {module_name(f) for f in files}
    wrong = []
    for f in files:
        me = module_name(f)
        for layer, banned in FORBIDDEN.items():
            if me == layer or me.startswith(layer + "."):
                wrong += [f"{me} -> {dep}" for dep in sorted(imports(f, modules))
                          if any(dep == b or dep.startswith(b + ".") for b in banned)]
    assert not wrong, "imports against the layering: " + "; ".join(wrong)
