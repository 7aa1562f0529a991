"""`current.card` inside a running task, and the task entrypoint's hooks that write cards to the store.

    @card(type="blank", id="progress", refresh_interval=1)
    @step
    def train(self):
        bar = ProgressBar(max=10); current.card["progress"].append(bar)
        for i in range(10):
            bar.update(i); current.card.refresh()     # written now, or at most every refresh_interval s

`start_task_cards(func, spec, store)` runs before the step (sets `current.card`); `TaskCards.finish(...)` runs after
it, on success and on failure, and writes the final cards (the "default" card with the task's artifacts). Writing
a card never fails the step: errors are logged. stoker.features.card calls both in every task.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from stoker.cards.store import cards_prefix, check_card_id, write_card
from stoker.store.blobs import BlobStore

log = logging.getLogger(__name__)
MONITOR_CARD_ID = "monitor"


class _Card:
    """One @card of the running task: its components and its writes to the store (rate-limited)."""

    def __init__(self, attrs: dict[str, Any], card_id: str, store: BlobStore, prefix: str, pathspec: str,
                 attempt: int) -> None:
        self.type = attrs.get("type") or "default"
        self.user_id = attrs.get("id")
        self.id = card_id
        self.options = dict(attrs.get("options") or {})
        self.refresh_interval = float(attrs.get("refresh_interval") or 0)
        self.store, self.prefix, self.pathspec, self.attempt = store, prefix, pathspec, attempt
        self.components: list[Any] = []
        self.last_write = 0.0
        self.lock = threading.Lock()
        self.timer: threading.Timer | None = None
        self.closed = False
        self.started = time.time()
        # Metaflow's semantics: a custom type's class says whether components may be appended and whether it
        # renders while the step runs; the built-in types allow both
        from stoker.cards.card import BUILTIN_TYPES, get_card_class  # (a task with no @card never imports it)

        self.custom = self.type not in BUILTIN_TYPES
        self.cls = get_card_class(self.type) if self.custom else None
        self.editable = not self.custom or bool(self.cls is not None and self.cls.ALLOW_USER_COMPONENTS)
        self.runtime_card = not self.custom or bool(self.cls is not None and self.cls.RUNTIME_UPDATABLE)
        self.customize = str(attrs.get("customize")) == "True"  # as Metaflow reads it (decospecs give strings)
        self.save_errors = str(attrs.get("save_errors", True)) != "False"
        self.timeout = attrs.get("timeout")
        self.user_data: Any = None
        self.render_seq = 0
        self.owner: TaskCards | None = None
        if self.custom and self.cls is None:
            print(f"@card warning: no card type {self.type!r} (stoker has 'default', 'blank' and the custom types "
                  f"found: {sorted(_custom_types())}); card {card_id!r} will be an error card", flush=True)

    def data(self, final: bool = False, extra: Callable[[], dict[str, list]] | None = None) -> dict[str, Any]:
        """The card's JSON: header, the user's components and, for a default card, the task's information."""
        comps = [render_component(c) for c in list(self.components)]
        if self.type == "default":
            more = extra() if extra else {"head": [], "tail": []}
            comps = more["head"] + comps + more["tail"]
        title = self.options.get("title") or (self.user_id or f"{self.pathspec.split('/')[2]}")
        return {"id": self.id, "user_id": self.user_id, "type": self.type, "title": str(title),
                "updated": time.time(), "final": final, "pathspec": self.pathspec, "attempt": self.attempt,
                "components": comps}

    def runtime_data(self, mode: str, final: bool) -> dict[str, Any]:
        """Metaflow's `_get_latest_data`: what render_runtime/refresh get and `runtime_data` holds in render."""
        comps = {}
        for c in list(self.components):
            if getattr(c, "REALTIME_UPDATABLE", False):
                try:
                    comps[c.component_id or render_component(c).get("id")] = render_component(c)
                except Exception:  # noqa: BLE001, S112 - Metaflow drops a component that cannot render
                    continue
        return {"user": self.user_data or {}, "components": comps, "render_seq": "final" if final else
                self.render_seq, "component_update_ts": self.started, "mode": mode}

    def custom_payload(self, mode: str, final: bool) -> tuple[dict[str, Any], str] | None:
        """A custom card's JSON and HTML (its render, or Metaflow's error card), or None: nothing to store."""
        from stoker.cards.custom import CardTask, error_card, metaflow_components, render_custom

        owner = self.owner
        task = CardTask(self.pathspec, self.attempt, self.store, owner.artifacts if final and owner else None,
                        finished=final, successful=final)
        comps = metaflow_components([render_component(c) for c in list(self.components)])
        out = render_custom(self.type, self.cls, mode, task, self.runtime_data(mode, final), self.options or None,
                            comps, owner.graph() if owner else None, owner.flow if owner else None,
                            self.timeout, self.save_errors)
        if out.problem:
            print(f"@card {self.id}: Card render failed with error : \n\n {out.problem}", flush=True)
        if out.error is not None:
            data = error_card(self.id, self.type, self.pathspec, self.attempt, out.error)
            return data, render_card_html(data)
        if out.html is None:
            return None
        update = None
        if self.runtime_card and self.cls is not None:
            upd = render_custom(self.type, self.cls, "refresh", task, self.runtime_data("refresh", final),
                                self.options or None, [], owner.graph() if owner else None,
                                owner.flow if owner else None, self.timeout, self.save_errors)
            update = upd.data_update
        title = self.options.get("title") or self.user_id or self.type
        return ({"id": self.id, "user_id": self.user_id, "type": self.type, "title": str(title),
                 "updated": time.time(), "final": final, "pathspec": self.pathspec, "attempt": self.attempt,
                 "components": [], "custom": True,
                 "html": out.html, "data_update": update}, out.html)

    def write_custom(self, mode: str, final: bool) -> bool:
        try:
            payload = self.custom_payload(mode, final)
        except Exception as e:  # noqa: BLE001 - a card must never fail the step
            log.warning("@card %s: rendering the card failed (%s: %s)", self.id, type(e).__name__, e)
            return False
        if payload is None:
            return False
        try:
            write_card(self.store, self.prefix, payload[0], payload[1])
        except Exception as e:  # noqa: BLE001
            log.warning("@card %s: writing the card failed (%s: %s)", self.id, type(e).__name__, e)
            return False
        self.last_write = time.time()
        return True

    def write(self, data: dict[str, Any]) -> bool:
        try:
            write_card(self.store, self.prefix, data, render_card_html(data))
        except Exception as e:  # noqa: BLE001 - a card must never fail the step
            log.warning("@card %s: writing the card failed (%s: %s)", self.id, type(e).__name__, e)
            return False
        self.last_write = time.time()
        return True

    def refresh(self, extra: Callable[[], dict[str, list]] | None = None, force: bool = False) -> None:
        """Write the card now, or, within `refresh_interval` of the last write, once the interval has passed."""
        with self.lock:
            if self.closed or not self.runtime_card:  # Metaflow ignores refreshes of other custom cards
                return
            wait = self.last_write + self.refresh_interval - time.time()
            if force or wait <= 0:
                self._cancel()
                self._write_live(extra)
            elif self.timer is None:
                self.timer = threading.Timer(wait, self._deferred, args=(extra,))
                self.timer.daemon = True
                self.timer.start()

    def _write_live(self, extra: Callable[[], dict[str, list]] | None) -> None:
        if self.custom:
            self.render_seq += 1
            self.write_custom("render_runtime", final=False)
        else:
            self.write(self.data(extra=extra))

    def _deferred(self, extra: Callable[[], dict[str, list]] | None) -> None:
        with self.lock:
            self.timer = None
            if not self.closed:
                self._write_live(extra)

    def _cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def finish(self, extra: Callable[[], dict[str, list]] | None) -> None:
        with self.lock:
            self._cancel()
            self.closed = True
            if not self.custom:
                self.write(self.data(final=True, extra=extra))
            elif self.owner is not None and self.owner.succeeded():  # Metaflow renders them only then
                self.write_custom("render", final=True)


def render_component(component: Any) -> dict[str, Any]:
    """(stoker.cards.components, imported when a task first has a component: most tasks have none)"""
    from stoker.cards.components import render_component as render

    return render(component)


def render_card_html(data: dict[str, Any]) -> str:
    """(stoker.cards.render, with html and the svg charts: imported when a task first writes a card)"""
    from stoker.cards.render import render_card_html as render

    return render(data)


def preload_renderers() -> None:
    """What a task with a @card imports on its first write (a fork server makes it once, for a flow with cards)."""
    import stoker.cards.card
    import stoker.cards.components
    import stoker.cards.render  # noqa: F401


def _custom_types() -> list[str]:
    from stoker.cards.card import card_types

    return list(card_types())


def _json_or_none(data: Any) -> Any:
    import json

    try:
        json.dumps(data)
    except (TypeError, ValueError):
        log.warning("current.card.refresh(data): the data is not JSON serializable; it is ignored")
        print("@card warning: Data provided to `refresh` is not JSON serializable. It will be ignored.", flush=True)
        return None
    return data


def _default_editable(cards: list[_Card], warn: Callable[[str], None]) -> _Card | None:
    """The card `current.card.append` goes to, by Metaflow's rules (CardComponentCollector._finalize): the only
    editable card; else the only editable card without an id; the one editable card with customize=True wins."""
    editable = [c for c in cards if c.editable]
    if len(editable) == 1:
        return editable[0]
    unnamed = [c for c in editable if c.user_id is None]
    chosen = unnamed[0] if len(unnamed) == 1 else None
    customized = [c for c in editable if c.customize]
    if len(customized) > 1:
        warn("Multiple @card decorators have `customize=True`. Only one @card per @step can have "
             "`customize=True`. `current.card.append` will ignore all decorators marked `customize=True`.")
    elif len(customized) == 1:
        chosen = customized[0]
    return chosen


class CardComponents:
    """The components of one card (`current.card["id"]`): append, extend, clear, refresh, iterate."""

    def __init__(self, card: _Card | None, owner: CardCollector) -> None:
        self._card, self._owner = card, owner

    def _target(self) -> list[Any]:
        if self._card is None:
            self._owner._warn("no such card: components appended to it are dropped")
            return []
        return self._card.components

    def append(self, component: Any) -> None:
        self._target().append(component)

    def extend(self, components: Iterable[Any]) -> None:
        self._target().extend(components)

    def clear(self) -> None:
        self._target().clear()

    def refresh(self, data: Any = None, force: bool = False) -> None:
        """Write the card (rate-limited); `data` is what a custom card's render_runtime/refresh get as `user`."""
        if self._card is not None:
            self._card.user_data = _json_or_none(data)
            self._card.refresh(self._owner._extra, force=force)

    @property
    def components(self) -> dict[str, Any]:
        """The card's components that have an id (`component.component_id`), by id."""
        return {c.component_id: c for c in self._target() if getattr(c, "component_id", None)}

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._target()))

    def __len__(self) -> int:
        return len(self._target())


class CardCollector:
    """`current.card`: `append/extend/clear` go to the step's default editable card (the one @card without id,
    or the only @card); `current.card["id"]` is the card with that id; `refresh()` writes every card."""

    def __init__(self, cards: list[_Card], extra: Callable[[], dict[str, list]] | None = None) -> None:
        self._cards = cards
        self._extra = extra
        self._warned: set[str] = set()
        self._default = _default_editable(cards, self._warn)

    def _warn(self, why: str) -> None:
        if why not in self._warned:
            self._warned.add(why)
            log.warning("current.card: %s", why)
            print(f"@card warning: {why}", flush=True)

    def _default_components(self) -> CardComponents:
        if self._default is None:
            if not self._cards:
                self._warn("this step has no @card, so components are dropped; add @card above @step")
            elif len(self._cards) == 1:
                c = self._cards[0]
                self._warn(f"Card of type `{c.type}` " + ("is not an editable card." if c.cls is not None
                                                           else "doesn't exist.") + " Components are dropped.")
            else:
                self._warn("this step has several @card decorators: use current.card['<id>'].append(...)")
        return CardComponents(self._default, self)

    def append(self, component: Any) -> None:
        self._default_components().append(component)

    def extend(self, components: Iterable[Any]) -> None:
        self._default_components().extend(components)

    def clear(self) -> None:
        self._default_components().clear()

    @property
    def components(self) -> dict[str, Any]:
        return self._default_components().components

    def __getitem__(self, card_id: str) -> CardComponents:
        for c in self._cards:
            if c.user_id == card_id:
                return CardComponents(c, self)
        self._warn(f"no @card(id={card_id!r}) on this step (ids: {[c.user_id for c in self._cards]})")
        return CardComponents(None, self)

    def __setitem__(self, card_id: str, components: Iterable[Any]) -> None:
        target = self[card_id]
        target.clear()
        target.extend(components)

    def __contains__(self, card_id: str) -> bool:
        return any(c.user_id == card_id for c in self._cards)

    def refresh(self, data: Any = None, force: bool = False) -> None:
        """Write every card of the step now (at most once per its refresh_interval; force=True: now); `data`
        goes to the default editable card (a custom runtime card's `data["user"]`)."""
        if self._default is not None:
            self._default.user_data = _json_or_none(data)
        for c in self._cards:
            c.refresh(self._extra, force=force)

    def get(self, type: str | None = None) -> list[CardComponents]:  # noqa: A002 - Metaflow's name
        """The cards of this step of a type (Metaflow's `current.card.get(type=...)`)."""
        return [CardComponents(c, self) for c in self._cards if c.type == type]

    def __repr__(self) -> str:
        return f"current.card({', '.join(c.id for c in self._cards) or 'no @card on this step'})"


class TaskCards:
    """The cards of one task attempt, from before the step runs until its final write."""

    def __init__(self, func: Any, spec: Any, store: BlobStore, flow: Any = None) -> None:
        self.func, self.spec, self.store, self.flow = func, spec, store, flow
        self.pathspec = f"{spec.flow}/{spec.run_id}/{spec.step}/{spec.task_id}"
        self.prefix = cards_prefix(spec.flow, spec.run_id, spec.step, spec.task_id, spec.attempt)
        self.started = time.time()
        self.artifacts: dict[str, Any] | None = None
        self.manifest: dict[str, Any] | None = None
        decos = [d for d in getattr(func, "decorators", []) if d.name == "card"]
        self.cards: list[_Card] = []
        used: set[str] = set()
        for d in decos:
            a = d.attributes
            base = a.get("id") or a.get("type") or "default"
            cid, n = base, 1
            while cid in used:
                cid, n = f"{base}_{n}", n + 1
            used.add(cid)
            try:
                check_card_id(cid)
            except Exception as e:  # noqa: BLE001
                log.warning("@card: %s", e)
                continue
            self.cards.append(_Card(a, cid, store, self.prefix, self.pathspec, spec.attempt))
            self.cards[-1].owner = self
        self.collector = CardCollector(self.cards, self._extra)

    def graph(self) -> dict[str, Any] | None:
        """Metaflow's graph_info of the flow ({"steps", "start_step", "end_step"}), for custom cards."""
        from stoker.flow.current import current

        try:
            g = current.graph
        except Exception:  # noqa: BLE001
            return None
        return {k: g.get(k) for k in ("steps", "start_step", "end_step")}

    def succeeded(self) -> bool:
        m = self.manifest or {}
        return m.get("status", "failed" if m.get("exception") else "ok") == "ok"

    def _extra(self) -> dict[str, list]:
        from stoker.cards.default_card import default_card_parts

        return default_card_parts(self.spec, self.started, self.artifacts, self.manifest)

    def finish(self, artifacts: dict[str, Any] | None = None, manifest: dict[str, Any] | None = None) -> None:
        """Write the final cards (never raises)."""
        self.artifacts, self.manifest = artifacts, manifest
        for c in self.cards:
            try:
                c.finish(self._extra)
            except Exception as e:  # noqa: BLE001
                log.warning("@card %s: the final card failed (%s: %s)", c.id, type(e).__name__, e)


def start_task_cards(func: Any, spec: Any, store: BlobStore, flow: Any = None) -> TaskCards:
    """Before the step: set `current.card` for it, only when it has a @card (as in Metaflow, so the docs'
    `if hasattr(current, "card"):` guard works). Call `.finish(artifacts, manifest)` after it (even on failure)."""
    from stoker.flow.current import current

    tc = TaskCards(func, spec, store, flow)
    if any(d.name == "card" for d in getattr(func, "decorators", [])):
        current._set(card=tc.collector)
    else:
        current.__dict__.get("_values", {}).pop("card", None)
    return tc
