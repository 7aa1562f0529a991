"""Rendering a custom card type (stoker.cards.card) as Metaflow's `card create` does, in the task's process.

`render_custom(...)` instantiates the card class with Metaflow's arguments, calls `render(task)` (or
`render_runtime(task, data)` / `refresh(task, data)` while the step runs) under the decorator's time limit, puts
the reload token in the HTML, and turns every failure into Metaflow's messages: with `save_errors` the card becomes
an error card, without it nothing is stored and the message is logged. The `task` a card gets is `CardTask`: the
attempt's artifacts read from the store (its manifest is not ingested yet), and the client's `Task` for anything
else.
"""

from __future__ import annotations

import inspect
import logging
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

from stoker.store.blobs import BlobStore

log = logging.getLogger(__name__)


class CardTask:
    """What `render(task)` gets: `pathspec`, `id`, `data.<name>`, `task["<name>"].data`, `finished`, ...;
    other attributes come from the client's Task (which needs the run's index, as on this machine)."""

    def __init__(self, pathspec: str, attempt: int, store: BlobStore, artifacts: dict[str, Any] | None,
                 finished: bool, successful: bool) -> None:
        self.pathspec = pathspec
        self.flow_name, self.run_id, self.step_name, self.id = pathspec.split("/")
        self.current_attempt = attempt
        self.finished, self.successful = finished, successful
        self._store, self._descs = store, dict(artifacts or {})
        self._values: dict[str, Any] = {}
        self.data = _CardTaskData(self)

    def _load(self, name: str) -> Any:
        if name not in self._values:
            from stoker.store.artifacts import load_artifact

            self._values[name] = load_artifact(self._store, self._descs[name], name=name, pathspec=self.pathspec)
        return self._values[name]

    def __getitem__(self, name: str) -> _CardArtifact:
        if name not in self._descs:
            raise KeyError(f"task {self.pathspec} has no artifact {name!r} (it has {sorted(self._descs)})")
        return _CardArtifact(self, name)

    def __contains__(self, name: str) -> bool:
        return name in self._descs

    def __iter__(self) -> Any:
        return iter([_CardArtifact(self, n) for n in sorted(self._descs)])

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        from stoker.client import Task

        return getattr(Task(self.pathspec, _namespace_check=False), name)

    def __repr__(self) -> str:
        return f"Task('{self.pathspec}')"


class _CardTaskData:
    def __init__(self, task: CardTask) -> None:
        self._task = task

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name not in self._task._descs:
            raise AttributeError(f"task {self._task.pathspec} has no artifact {name!r}")
        return self._task._load(name)

    def __contains__(self, name: str) -> bool:
        return name in self._task._descs


@dataclass
class _CardArtifact:
    _task: CardTask
    id: str

    @property
    def data(self) -> Any:
        return self._task._load(self.id)

    @property
    def pathspec(self) -> str:
        return f"{self._task.pathspec}/{self.id}"


def metaflow_components(comps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The components a card class gets, shaped as Metaflow serializes them: the user's components in one
    section, with Metaflow's keys (`source` of a markdown, `columns` of a table) beside stoker's."""
    out = []
    for c in comps:
        c = dict(c)
        if c.get("type") == "markdown":
            text = c.get("text")  # Metaflow's MarkdownComponent puts a newline before text without a heading
            c.setdefault("source", text if text is None or text.startswith("#") else "\n" + text)
        elif c.get("type") == "table":
            c.setdefault("columns", c.get("headers") or [])
            c.setdefault("vertical", False)
        out.append(c)
    return [{"type": "section", "contents": out}] if out else []


def reload_token(card: Any, task: Any, data: dict[str, Any]) -> str:
    """Metaflow's card_cli._extract_reload_token."""
    if "render_seq" not in data:
        return "never"
    if data["render_seq"] == "final":
        return "final"
    policy = getattr(card, "RELOAD_POLICY", "never")
    if policy == "always":
        return f"render-seq-{data['render_seq']}"
    if policy == "onchange":
        return str(card.reload_content_token(task, data))
    return "never"


class _TimedOut(Exception):
    def __init__(self, stack: str) -> None:
        super().__init__(stack)
        self.stack = stack


def call_with_limit(fn: Any, timeout: float | None) -> Any:
    """`fn()` in a thread, waited for `timeout` s (None or < 0: no limit). Past it, _TimedOut carries the
    stack where the call was (the thread is left to finish or to end with the process, as it cannot be killed)."""
    if timeout is None or float(timeout) < 0:
        return fn()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    t = threading.Thread(target=run, name="card-render", daemon=True)
    t.start()
    t.join(float(timeout))
    if t.is_alive():
        frame = sys._current_frames().get(t.ident or -1)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else ""
        raise _TimedOut("Traceback (most recent call last):\n" + stack + "TimeoutError\n")
    if "error" in box:
        raise box["error"]
    return box.get("value")


@dataclass
class Rendered:
    """A custom card's output: `html` (None: nothing to store), `error` (the error card's message, if it is one),
    `data_update` (refresh()'s JSON, if any), `problem` (what to log when nothing is stored)."""

    html: str | None = None
    error: str | None = None
    data_update: dict[str, Any] | None = None
    problem: str | None = None


def _make(cls: type, options: dict[str, Any] | None, components: list[Any], graph: Any, flow: Any) -> Any:
    graph_info = graph if isinstance(graph, dict) and "steps" in graph else None
    steps = graph_info["steps"] if graph_info else graph
    kw: dict[str, Any] = {"components": components, "graph": steps, "flow": flow}
    try:
        if "graph_info" in inspect.signature(cls).parameters:
            kw["graph_info"] = graph_info
    except (TypeError, ValueError):
        pass
    if options:  # Metaflow passes --options only when there are some
        kw["options"] = options
    return cls(**kw)


def render_custom(card_type: str, cls: type | None, mode: str, task: Any, data: dict[str, Any],
                  options: dict[str, Any] | None, components: list[Any], graph: Any, flow: Any,
                  timeout: float | None, save_errors: bool) -> Rendered:
    """One `card create --mode MODE` of Metaflow (card_cli.create), without the subprocess."""
    shown_options = options or None  # what Metaflow's messages print
    if cls is None:
        msg = f"MetaflowCard named {card_type} not found. Check the `type` attribute in @card"
        return Rendered(error=msg) if save_errors and mode != "refresh" else Rendered(problem=msg)
    try:
        card = _make(cls, options, components, graph, flow)
    except TypeError:
        msg = f"Card of type {card_type} cannot support arguments {shown_options}"
        return Rendered(error=msg) if save_errors and mode != "refresh" else Rendered(problem=msg)

    def call() -> tuple[Any, bool]:
        if mode == "render":
            type(card).runtime_data = property(fget=lambda _, d=data: d)  # as Metaflow sets it, on the class
            return card.render(task), True
        fn = card.render_runtime if mode == "render_runtime" else card.refresh
        try:
            return fn(task, data), True
        except NotImplementedError:
            return None, False

    try:
        out, implemented = call_with_limit(call, timeout)
    except _TimedOut as e:
        if mode == "refresh" or not save_errors:
            return Rendered(problem=f"card rendering timed out after {timeout} seconds")
        return Rendered(error=(f"\nCard rendering timed out after {timeout} seconds. To increase the timeout "
                               f"duration for card rendering, please set the `timeout` parameter in the @card "
                               f"decorator. \nStack Trace : \n{e.stack}"))
    except Exception:  # noqa: BLE001 - the card's own bug
        msg = (f"Card of type {card_type} is unable to be rendered with arguments {shown_options}.\nStack trace : "
               f" {traceback.format_exc()}")
        return Rendered(error=msg) if save_errors and mode != "refresh" else Rendered(problem=msg)
    token = reload_token(card, task, data)
    if mode == "refresh":
        if not implemented or out is None:
            return Rendered()
        return Rendered(data_update={"reload_token": token, "data": out, "created_on": time.time()})
    if not implemented:
        if save_errors and mode == "render_runtime":
            return Rendered(error=(f"Card of type {card_type} is a runtime time card with no `render_runtime` "
                                   f"implemented. Please implement `render_runtime` method to allow rendering "
                                   f"this card at runtime."))
        return Rendered()
    if out is None or not isinstance(out, str):
        if save_errors:
            return Rendered(error=f"No information rendered from card of type {card_type}")
        return Rendered(problem=f"No information rendered from card of type {card_type}")
    return Rendered(html=out.replace(card.RELOAD_POLICY_TOKEN, token))


def error_card(card_id: str, card_type: str, pathspec: str, attempt: int, message: str) -> dict[str, Any]:
    """Metaflow's ErrorCard ("Error Card" / "Card Render Failed With Error" and the message), as a stoker card."""
    return {"id": card_id, "type": card_type, "title": "Error Card", "updated": time.time(), "final": True,
            "pathspec": pathspec, "attempt": attempt, "error_card": True,
            "components": [{"type": "markdown", "text": "## Card Render Failed With Error"},
                           {"type": "error", "message": message}]}
