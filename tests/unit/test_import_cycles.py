"""The house's layers hold: an AST scan of every module under src/stoker, counting module-level and function-level
imports of stoker modules (``from stoker.x import y``, ``import stoker.x``, relative imports), must find no cycle
between modules and no import of a higher layer (docs/architecture.md draws them)."""

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


# The layers, bottom (0) to top: a package may import its own modules and those of lower layers only.
LAYERS: list[tuple[str, ...]] = [
    ("errors", "_environ", "_hashing"),
    ("exitstatus", "redact", "_process"),
    ("store",),  # objects -> blobs -> records and the index
    ("client", "data", "monitor"),  # the client API; the data and monitoring libraries
    ("train",),  # the training library (uses data and the store)
    ("flow",),  # FlowSpec, the graph, parameters, `current`, the decorator machinery
    ("distributed", "cards"),  # what a node of a @torchrun step does; cards
    ("features",),  # one module per decorator: its declaration and its behaviour
    ("runtime",),  # the driver, the member/node side, the contract
    ("backends",),  # local, slurm, aws: where tasks run
    ("runner", "ui", "recipes"),  # Runner/NBRunner, the web UI, the packaged flows
    ("cli",),
    ("stoker",),  # the package's own __init__: the public API
]
RANK = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}
# (importer, imported): upward imports with a reason
ALLOWED_UP = {
    ("stoker.backends.aws.image", "stoker"): "the package's __version__, for the image's tag",
    ("stoker.recipes.llama_pretrain", "stoker"): "a packaged flow imports stoker's public API as a user's does",
}


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "stoker"


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for me, deps in sorted(graph.items()):
        if me.rsplit(".", 1)[-1] == "__main__":  # `python -m stoker.x` entry points sit on top of everything
            continue
        a = package_of(me)
        for dep in sorted(deps):
            b = package_of(dep)
            if a != b and RANK[b] >= RANK[a] and (me, dep) not in ALLOWED_UP:
                wrong.append(f"{me} -> {dep} ({a} is layer {RANK[a]}, {b} layer {RANK[b]})")
    return wrong


def test_every_package_has_a_layer():
    packages = {package_of(module_name(f)) for f in (SRC / "stoker").rglob("*.py")}
    assert not packages - set(RANK), f"add {sorted(packages - set(RANK))} to LAYERS (and docs/architecture.md)"


def test_imports_point_down_the_layers():
    files = sorted((SRC / "stoker").rglob("*.py"))
    modules = {module_name(f) for f in files}
    wrong = upward_imports({module_name(f): imports(f, modules) for f in files})
    assert not wrong, "imports up the layers (move the code down, or inject it): " + "; ".join(wrong)


def test_the_layer_test_fails_on_an_upward_import():
    """A deliberately upward import (the store reaching for the runtime) is caught, with both layers named."""
    graph = {"stoker.store.blobs": {"stoker.runtime.driver.scheduler", "stoker.errors"},
             "stoker.runtime.driver.scheduler": set()}
    assert upward_imports(graph) == ["stoker.store.blobs -> stoker.runtime.driver.scheduler (store is layer 2, runtime "
                                     "layer 8)"]
