"""The static graph of a flow, read from the source of its step methods (as Metaflow does), and its lint.

Every error names `file:line` and the fix, and all are reported at once before anything runs.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass, field
from typing import Any

from stoker.flow.decorators import ParallelDecorator

RESERVED = {"next", "input", "index", "foreach_stack", "merge_artifacts", "name", "script_name", "cmd"}


@dataclass
class StepNode:
    """One step: where it is, what it calls next, and its place among splits and joins."""

    name: str
    file: str
    lineno: int
    num_args: int
    out_funcs: list[str] = field(default_factory=list)
    kind: str = "linear"  # outgoing: linear | split | foreach | parallel | switch | end
    foreach_var: str | None = None
    condition: str | None = None  # a switch: the artifact whose value picks the case
    switch_cases: dict[Any, str] = field(default_factory=dict)  # a switch: case value -> step
    num_parallel: Any = None  # int literal, or an ast expression string
    next_lineno: int = 0
    in_funcs: list[str] = field(default_factory=list)
    split_parents: list[str] = field(default_factory=list)  # enclosing splits, outermost first
    split_branches: list[str] = field(default_factory=list)  # the branch of each enclosing split it is on
    matching_join: str | None = None
    decorators: list = field(default_factory=list)
    doc: str = ""
    problems: list[tuple[int, str]] = field(default_factory=list)

    @property
    def is_join(self) -> bool:
        return self.num_args == 2

    @property
    def is_recursive(self) -> bool:
        """A switch that may go back to itself (Metaflow's only kind of loop)."""
        return self.kind == "switch" and self.name in self.out_funcs

    @property
    def is_gang(self) -> bool:
        return any(isinstance(d, ParallelDecorator) for d in self.decorators)

    def where(self, lineno: int | None = None) -> str:
        return f"{self.file}:{lineno or self.lineno}"


def _class_location(flow_cls: type) -> tuple[str, int]:
    """File and line of the class statement (works for flows run as __main__ and for loaded files)."""
    file = None
    try:
        file = inspect.getsourcefile(flow_cls)
    except TypeError:
        pass
    if not file:
        funcs = [v for v in vars(flow_cls).values() if callable(v) and hasattr(v, "__code__")]
        file = funcs[0].__code__.co_filename if funcs else "<unknown>"
    try:
        with open(file) as f:
            for i, line in enumerate(f, 1):
                if line.lstrip().startswith(f"class {flow_cls.__name__}"):
                    return file, i
    except OSError:
        pass
    return file, 1


def _self_attr(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


def _is_next_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and _self_attr(node.func) == "next"


def _parse_switch(node: StepNode, call: ast.Call, kw: dict[str, ast.expr]) -> None:
    """`self.next({"a": self.a, "b": self.b}, condition="attr")`: keys are literals (or self.<config>.<key>)."""
    how = ('a switch is self.next({"case": self.step, ...}, condition="artifact") with literal keys '
           '(strings, numbers, or self.<config>.<key>)')
    cond = kw.get("condition")
    if not (isinstance(cond, ast.Constant) and isinstance(cond.value, str)):
        node.problems.append((node.next_lineno, f"step {node.name}: {how}; "
                              + ("condition= must be a string" if cond is not None else "add condition=")))
        return
    if len(call.args) != 1 or not isinstance(call.args[0], ast.Dict) or set(kw) != {"condition"}:
        node.problems.append((node.next_lineno, f"step {node.name}: {how}, and nothing else (no foreach= or "
                              f"num_parallel=)"))
        return
    d = call.args[0]
    for key, value in zip(d.keys, d.values, strict=True):
        target = _self_attr(value)
        if isinstance(key, ast.Constant):
            case = key.value
        elif isinstance(key, ast.Attribute) and _self_attr(key.value):
            case = f"config:{_self_attr(key.value)}.{key.attr}"  # resolved when the step runs
        else:
            case = None
        if case is None or target is None:
            node.problems.append((node.next_lineno, f"step {node.name}: case {ast.unparse(key) if key else '**'}: "
                                  f"{ast.unparse(value)} is not supported: {how}"))
            return
        node.switch_cases[case] = target
    node.condition = cond.value
    node.kind = "switch"
    node.out_funcs = list(dict.fromkeys(node.switch_cases.values()))


class FlowGraph:
    """Steps of a FlowSpec class keyed by name, with `in_funcs`, split parents and matching joins."""

    def __init__(self, flow_cls: type) -> None:
        self.name = flow_cls.__name__
        self.nodes: dict[str, StepNode] = {}
        self.assigned: set[str] = set()  # every `self.x = ...` in any step
        self.class_attrs = {k for c in flow_cls.__mro__ for k in vars(c)}
        self._trees: dict[str, ast.Module | None] = {}
        self.edge_branch: dict[tuple[str, str], str] = {}  # (step, next step) -> branch of the innermost split
        self.file, self.lineno = _class_location(flow_cls)
        self.doc = inspect.cleandoc(flow_cls.__doc__ or "")  # the flow's docstring (`show` prints it)
        for attr in dir(flow_cls):
            func = getattr(flow_cls, attr, None)
            if callable(func) and getattr(func, "is_step", False):
                self.nodes[attr] = self._parse(attr, func)
        for node in self.nodes.values():
            for out in node.out_funcs:
                if out in self.nodes:
                    self.nodes[out].in_funcs.append(node.name)
        self.sorted_nodes = self._order()

    def _module_tree(self, file: str) -> ast.Module | None:
        """The parsed source file (whole files parse where a dedented method with a column-0 string won't)."""
        if file not in self._trees:
            try:
                with open(file) as f:
                    tree = ast.parse(f.read(), filename=file)
            except (OSError, SyntaxError):
                tree = None
            self._trees[file] = tree
            if tree is not None:  # anything assigned to self.<x> anywhere counts as set (helpers, setattr)
                for sub in ast.walk(tree):
                    targets: list[ast.AST] = []
                    if isinstance(sub, ast.Assign):
                        targets = list(sub.targets)
                    elif isinstance(sub, (ast.AnnAssign, ast.AugAssign, ast.For, ast.comprehension)):
                        targets = [sub.target]
                    elif isinstance(sub, ast.withitem) and sub.optional_vars is not None:
                        targets = [sub.optional_vars]
                    elif isinstance(sub, ast.Call) and getattr(sub.func, "id", None) == "setattr" \
                            and len(sub.args) >= 2 and isinstance(sub.args[1], ast.Constant):
                        self.assigned.add(str(sub.args[1].value))
                    for t in targets:
                        for el in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]):
                            a = _self_attr(el)
                            if a:
                                self.assigned.add(a)
        return self._trees[file]

    def _parse(self, name: str, func: Any) -> StepNode:
        func = inspect.unwrap(func)
        code = func.__code__
        tree = self._module_tree(code.co_filename)
        fdef = None
        if tree is not None:
            for n in ast.walk(tree):
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == code.co_name and \
                        code.co_firstlineno in (n.lineno, *(d.lineno for d in n.decorator_list)):
                    fdef = n
                    break
        if fdef is None:
            return StepNode(name=name, file=code.co_filename, lineno=code.co_firstlineno, num_args=1,
                            problems=[(code.co_firstlineno, f"cannot read the source of step {name}; keep flows "
                                                            f"in .py files")])
        file, off = code.co_filename, 0
        node = StepNode(name=name, file=file, lineno=fdef.lineno,
                        num_args=len(fdef.args.args), decorators=list(func.decorators),
                        doc=ast.get_docstring(fdef) or "")
        for err in func.decorator_errors:
            node.problems.append((node.lineno, err))
        calls = [n for n in ast.walk(fdef) if _is_next_call(n)]
        last = fdef.body[-1] if fdef.body else None
        if name == "end":
            node.kind = "end"
            for c in calls:
                node.problems.append((c.lineno + off, "the end step must not call self.next(); remove it"))
            return node
        if not calls:
            node.problems.append((node.lineno, f"step {name} never calls self.next(): end it with "
                                               f"self.next(self.<following step>)"))
            return node
        if len(calls) > 1 or not (isinstance(last, ast.Expr) and _is_next_call(last.value)):
            node.problems.append((calls[0].lineno + off, f"self.next() must be the last statement of step {name} "
                                  "and be called once; to choose the next step at run time use a switch: "
                                  'self.next({"a": self.a, "b": self.b}, condition="artifact")'))
        call = calls[-1]
        node.next_lineno = call.lineno + off
        kw = {k.arg: k.value for k in call.keywords}
        if "condition" in kw or (len(call.args) == 1 and isinstance(call.args[0], ast.Dict)):
            _parse_switch(node, call, kw)
            return node
        for arg in call.args:
            target = _self_attr(arg)
            if target is None:
                node.problems.append((node.next_lineno, f"self.next() in step {name} takes steps as self.<step>, "
                                      f"got {ast.unparse(arg)}"))
            else:
                node.out_funcs.append(target)
        if not node.out_funcs and not node.problems:
            node.problems.append((node.next_lineno, f"self.next() in step {name} names no step"))
        if "foreach" in kw:
            v = kw["foreach"]
            if not (isinstance(v, ast.Constant) and isinstance(v.value, str)):
                node.problems.append((node.next_lineno, "foreach= takes the name of an artifact as a string, "
                                      "e.g. self.next(self.work, foreach='items')"))
            else:
                node.foreach_var = v.value
            node.kind = "foreach"
        if "num_parallel" in kw:
            v = kw["num_parallel"]
            node.num_parallel = v.value if isinstance(v, ast.Constant) else ast.unparse(v)
            if "foreach" in kw:
                node.problems.append((node.next_lineno, "use either foreach= or num_parallel=, not both"))
            node.kind = "parallel"
        unknown = set(kw) - {"foreach", "num_parallel"}
        if unknown:
            node.problems.append((node.next_lineno, f"self.next() has no argument {', '.join(sorted(unknown))}"))
        if node.kind in ("foreach", "parallel") and len(node.out_funcs) > 1:
            node.problems.append((node.next_lineno, f"a {node.kind} goes to exactly one step; "
                                  f"got {len(node.out_funcs)}"))
        elif node.kind == "linear" and len(node.out_funcs) > 1:
            node.kind = "split"
        return node

    def _order(self) -> list[StepNode]:
        """Steps in breadth-first order from start (unreachable steps last)."""
        seen: list[str] = []
        queue = ["start"] if "start" in self.nodes else []
        while queue:
            n = queue.pop(0)
            if n in seen or n not in self.nodes:
                continue
            seen.append(n)
            queue.extend(self.nodes[n].out_funcs)
        rest = [n for n in sorted(self.nodes) if n not in seen]
        return [self.nodes[n] for n in seen + rest]

    def __getitem__(self, name: str) -> StepNode:
        return self.nodes[name]

    def __iter__(self):
        return iter(self.sorted_nodes)

    def __contains__(self, name: str) -> bool:
        return name in self.nodes

    def reachable_from(self, step: str) -> set[str]:
        """`step` and every step after it."""
        seen: set[str] = set()
        stack = [step] if step in self.nodes else []
        while stack:
            n = stack.pop()
            if n not in seen:
                seen.add(n)
                stack.extend(t for t in self.nodes[n].out_funcs if t in self.nodes)
        return seen

    def branch_index(self, step: str, join: str) -> int:
        """Which branch of the split that `join` closes a task of `step` arrives from (set by lint)."""
        split = self.closing_split(join)
        return split.out_funcs.index(self.edge_branch[(step, join)])

    def closing_split(self, join: str) -> StepNode:
        """The split, foreach or gang that a join step closes."""
        return self.nodes[self.nodes[join].split_parents[-1]]
