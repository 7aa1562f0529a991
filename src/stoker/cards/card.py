"""Custom card types: `MetaflowCard`, the base a user's card class derives from, and where stoker finds them.

    from stoker.cards import MetaflowCard                # was: from metaflow.cards import MetaflowCard

    class ScoresCard(MetaflowCard):
        type = "scores"                                  # @card(type="scores")
        ALLOW_USER_COMPONENTS = True                     # current.card.append(...) may target it

        def __init__(self, options={}, components=[], graph=None, flow=None, **kwargs):
            self.title = options.get("title", "Scores")

        def render(self, task):                          # the finished task: task.data.x, task["x"].data
            return f"<h1>{self.title}</h1><p>{task.data.scores}</p>"

A card type is found, as in Metaflow, in `metaflow_extensions/<org>/plugins/cards/<package>/__init__.py` (or
`.../plugins/cards/__init__.py`) on `sys.path` (next to the flow file, or installed), whose `CARDS` lists the
classes; and, for packages, through the `stoker.cards` entry point group (an entry point names a card class, a
list of them, or a module with `CARDS`). Built-in types ("default", "blank") cannot be replaced.
"""

from __future__ import annotations

import importlib
import logging
import os
import pkgutil
import re
from typing import Any

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "stoker.cards"
BUILTIN_TYPES = ("default", "blank")
TYPE_PATTERN = re.compile(r"^[a-zA-Z0-9_]+$")  # Metaflow's CARD_ID_PATTERN


class MetaflowCard:
    """Base of a card type (Metaflow's `MetaflowCard`): `type`, `render(task)` -> HTML, and for runtime cards
    `render_runtime(task, data)` and `refresh(task, data)`.

    The constructor gets `options` (the decorator's, when not empty), `components` (what `current.card` got,
    as JSON dicts), `graph` (the flow's steps) and `flow`, and `graph_info` when it accepts it.
    """

    RELOAD_POLICY_NEVER = "never"
    RELOAD_POLICY_ALWAYS = "always"
    RELOAD_POLICY_ONCHANGE = "onchange"
    RELOAD_POLICY_TOKEN = "[METAFLOW_RELOAD_TOKEN]"

    type: str | None = None
    ALLOW_USER_COMPONENTS = False
    RUNTIME_UPDATABLE = False
    RELOAD_POLICY = RELOAD_POLICY_NEVER
    scope = "task"
    runtime_data: Any = None

    def __init__(self, options: dict[str, Any] = {}, components: list[Any] = [],  # noqa: B006 - Metaflow's
                 graph: Any = None, flow: Any = None) -> None:
        pass

    def render(self, task: Any) -> str:
        """The card's HTML, given the finished task (`task.data.<name>`, `task["<name>"].data`)."""
        return NotImplementedError()  # type: ignore[return-value]  # what Metaflow's base returns

    def render_runtime(self, task: Any, data: dict[str, Any]) -> str:
        raise NotImplementedError()

    def refresh(self, task: Any, data: dict[str, Any]) -> Any:
        raise NotImplementedError()

    def reload_content_token(self, task: Any, data: dict[str, Any]) -> str:
        return "content-token"


_registry: dict[str, type] | None = None
_added: dict[str, type] = {}


def register_card(cls: type) -> type:
    """Register a card class from code (also usable as a class decorator)."""
    if not _valid(cls, "register_card"):
        raise TypeError(f"register_card({cls!r}): give a subclass of stoker.cards.MetaflowCard with a `type`")
    _added[cls.type] = cls  # type: ignore[attr-defined]
    return cls


def _valid(c: Any, where: str) -> bool:
    ok = isinstance(c, type) and issubclass(c, MetaflowCard) and bool(getattr(c, "type", None)) \
        and c.type not in BUILTIN_TYPES
    if not ok:
        log.warning("card types from %s: %r is not a MetaflowCard subclass with a new `type`; skipped", where, c)
    return ok


def _extension_card_modules() -> list[Any]:
    """Metaflow's layout: `metaflow_extensions.<org>.plugins.cards` (a module with CARDS, or a namespace whose
    sub-packages have CARDS), for every `metaflow_extensions` on sys.path."""
    try:
        ns = importlib.import_module("metaflow_extensions")
    except ImportError:
        return []
    found = []
    # an <org> folder is usually a namespace package (no __init__.py), which pkgutil.iter_modules does not list
    orgs = sorted({d.name for p in getattr(ns, "__path__", []) if os.path.isdir(p) for d in os.scandir(p)
                   if d.is_dir() and d.name.isidentifier()})
    for org in orgs:
        name = f"metaflow_extensions.{org}.plugins.cards"
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        except Exception as e:  # noqa: BLE001 - a broken extension must not stop the task
            log.warning("card types: importing %s failed (%s: %s)", name, type(e).__name__, e)
            continue
        if getattr(mod, "__file__", None):
            found.append(mod)
        for sub in pkgutil.iter_modules(getattr(mod, "__path__", []), name + "."):
            if not sub.ispkg:
                continue
            try:
                found.append(importlib.import_module(sub.name))
            except Exception as e:  # noqa: BLE001
                log.warning("card types: importing %s failed (%s: %s)", sub.name, type(e).__name__, e)
    return found


def _entry_point_cards() -> list[tuple[str, Any]]:
    from importlib.metadata import entry_points

    out = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
        except Exception as e:  # noqa: BLE001
            log.warning("card types: entry point %s (%s) failed to load (%s: %s)", ep.name, ep.value,
                        type(e).__name__, e)
            continue
        if isinstance(obj, type):
            out.append((f"entry point {ep.name}", obj))
        elif isinstance(obj, (list, tuple)):
            out += [(f"entry point {ep.name}", c) for c in obj]
        else:
            out += [(f"entry point {ep.name}", c) for c in getattr(obj, "CARDS", [])]
    return out


def card_types(reload: bool = False) -> dict[str, type]:
    """Every custom card type found (type -> class), first found wins as in Metaflow; cached per process."""
    global _registry
    if _registry is None or reload:
        reg: dict[str, type] = {}
        sources: list[tuple[str, Any]] = []
        for mod in _extension_card_modules():
            cards = getattr(mod, "CARDS", None)
            if isinstance(cards, list):
                sources += [(mod.__name__, c) for c in cards]
        sources += _entry_point_cards()
        for where, c in sources:
            if _valid(c, where) and c.type not in reg:
                reg[c.type] = c
        _registry = reg
    return {**_registry, **_added}


def get_card_class(card_type: str) -> type | None:
    """The class of a custom card type, or None (built-in types have none)."""
    if card_type in BUILTIN_TYPES:
        return None
    return card_types().get(card_type)
