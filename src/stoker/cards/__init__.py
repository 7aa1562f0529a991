"""Cards: human-readable reports of a task, with Metaflow's API (`from metaflow.cards import ...` becomes
`from stoker.cards import ...`).

    from stoker import FlowSpec, card, current, step
    from stoker.cards import Markdown, ProgressBar, Table

    @card(type="blank", refresh_interval=1)
    @step
    def start(self):
        bar = ProgressBar(max=10, label="work")
        current.card.append(Markdown("# Working"))
        current.card.append(bar)
        for i in range(10):
            bar.update(i + 1)
            current.card.refresh()           # the card is in the store while the step runs
        self.next(self.end)

Cards are stored as JSON and as a self-contained HTML page (`stoker.cards.store`); `stoker card view` opens one and
`stoker report` puts a whole run, its charts and its cards in one offline HTML file. `get_cards(task)` reads a
task's cards back. A card type of your own is a `MetaflowCard` subclass (stoker.cards.card).
"""

from __future__ import annotations

from typing import Any

from stoker.cards.card import MetaflowCard, register_card
from stoker.cards.components import (
    Artifact,
    Error,
    Image,
    Markdown,
    MetaflowCardComponent,
    ProgressBar,
    Table,
    UserComponent,
    VegaChart,
)
from stoker.errors import StokerError

__all__ = ["Artifact", "Error", "Image", "Markdown", "MetaflowCard", "MetaflowCardComponent", "ProgressBar", "Table",
           "UserComponent", "VegaChart", "Card", "CardNotPresentException", "get_cards", "register_card"]


class CardNotPresentException(StokerError):
    """`get_cards` of a task that has no card (Metaflow's exception of the same name)."""

    headline = "Card not found in datastore"

    def __init__(self, pathspec: str) -> None:
        super().__init__(f"Card not found for pathspec {pathspec}")


class Card:
    """A stored card of a task (what `get_cards` returns): `id` (the @card's id, None without one, as in Metaflow),
    `type`, `get()` (HTML), `get_data()` (JSON)."""

    def __init__(self, ref: Any, store: Any) -> None:
        self._ref, self._store = ref, store

    @property
    def id(self) -> str | None:
        data = self.get_data()
        return data["user_id"] if "user_id" in data else self._ref.id  # (cards written before user_id: the name)

    @property
    def type(self) -> str | None:
        return self.get_data().get("type")

    def get(self) -> str:
        return self._ref.html(self._store)

    def get_data(self) -> dict[str, Any]:
        return self._ref.data(self._store)

    def __repr__(self) -> str:
        r = self._ref
        return f"Card({r.flow}/{r.run_id}/{r.step}/{r.task_id} attempt {r.attempt}, id={r.id!r})"


def get_cards(task: Any, id: str | None = None, type: str | None = None, store: Any = None) -> list[Card]:
    """The cards of a task (a pathspec `Flow/run/step/task` or a client Task), read from the store; a task with no
    card raises CardNotPresentException, as in Metaflow."""
    from stoker.cards.store import list_cards
    from stoker.store.blobs import open_store

    pathspec = task if isinstance(task, str) else task.pathspec
    parts = pathspec.strip("/").split("/")
    if len(parts) != 4:
        raise ValueError(f"get_cards({pathspec!r}): give a task pathspec FLOW/RUN/STEP/TASK or a Task")
    store = store or (getattr(task, "_store", None) if not isinstance(task, str) else None) or open_store()
    attempt = None if isinstance(task, str) else getattr(task, "current_attempt", None)
    refs = list_cards(store, *parts, attempt=attempt) or list_cards(store, *parts)
    if not refs:
        raise CardNotPresentException(pathspec)
    cards = [Card(r, store) for r in refs if id is None or r.id == id]
    return [c for c in cards if type is None or c.type == type]
