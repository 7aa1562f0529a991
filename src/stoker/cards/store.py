"""Where cards live in the store, and reading them back (the CLI, the report and the UI use these).

    runs/<flow>/<run>/cards/<step>/<task>/<attempt>/<card_id>.json   {"id", "type", "title", "updated", "final",
                                                                      "pathspec", "attempt", "components": [...]}
    runs/<flow>/<run>/cards/<step>/<task>/<attempt>/<card_id>.html   the same card as a self-contained page

Only the store is read, so a card shows while its task still runs, wherever it runs.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from stoker.errors import StoreError
from stoker.store.blobs import BlobStore
from stoker.store.manifest import run_prefix

_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


def check_card_id(card_id: str) -> str:
    """A card id becomes a file name: letters, digits, `_`, `.` and `-` only."""
    if not isinstance(card_id, str) or not _ID_RE.match(card_id) or card_id.startswith("."):
        raise StoreError(f"card id {card_id!r} is invalid: use letters, digits, '_', '-' and '.' "
                         f"(up to 100 characters), e.g. @card(id=\"training\")")
    return card_id


def cards_prefix(flow: str, run_id: str, step: str | None = None, task_id: str | None = None,
                 attempt: int | None = None) -> str:
    """`runs/<flow>/<run>/cards/[<step>/[<task>/[<attempt>/]]]`."""
    p = f"{run_prefix(flow, run_id)}cards/"
    for part in (step, task_id, None if attempt is None else int(attempt)):
        if part is None:
            break
        p += f"{part}/"
    return p


def write_card(store: BlobStore, prefix: str, card: dict[str, Any], html_text: str) -> None:
    """Write a card's JSON and HTML under `prefix` (the JSON last: a reader that sees it finds the HTML too)."""
    cid = check_card_id(card["id"])
    store.write(f"{prefix}{cid}.html", html_text.encode(), durable=False)
    store.write(f"{prefix}{cid}.json", json.dumps(card, separators=(",", ":"), default=str).encode(),
                durable=False)


@dataclass(frozen=True)
class CardRef:
    """One stored card of one task attempt."""

    flow: str
    run_id: str
    step: str
    task_id: str
    attempt: int
    id: str

    @property
    def prefix(self) -> str:
        return cards_prefix(self.flow, self.run_id, self.step, self.task_id, self.attempt)

    def data(self, store: BlobStore) -> dict[str, Any]:
        """The card's JSON."""
        return json.loads(store.read(f"{self.prefix}{self.id}.json"))

    def html(self, store: BlobStore) -> str:
        """The card's HTML page (re-rendered from its JSON when the HTML is missing)."""
        name = f"{self.prefix}{self.id}.html"
        if store.exists(name):
            return store.read(name).decode("utf-8", errors="replace")
        from stoker.cards.render import render_card_html

        return render_card_html(self.data(store))


def _attempts(store: BlobStore, flow: str, run_id: str, step: str, task_id: str) -> dict[int, list[str]]:
    prefix = cards_prefix(flow, run_id, step, task_id)
    out: dict[int, list[str]] = {}
    for name in store.list(prefix):
        rest = name[len(prefix):].split("/")
        if len(rest) == 2 and rest[0].isdigit() and rest[1].endswith(".json"):
            out.setdefault(int(rest[0]), []).append(rest[1][:-5])
    return out


def task_ids_with_cards(store: BlobStore, flow: str, run_id: str, step: str) -> list[str]:
    """The tasks of a step that have cards, in numeric order."""
    prefix = cards_prefix(flow, run_id, step)
    ids = {n[len(prefix):].split("/")[0] for n in store.list(prefix)}
    return sorted(ids, key=lambda t: (not t.isdigit(), int(t) if t.isdigit() else 0, t))


def steps_with_cards(store: BlobStore, flow: str, run_id: str) -> list[str]:
    prefix = cards_prefix(flow, run_id)
    return sorted({n[len(prefix):].split("/")[0] for n in store.list(prefix)})


def list_cards(store: BlobStore, flow: str, run_id: str, step: str, task_id: str,
               attempt: int | None = None) -> list[CardRef]:
    """The cards of a task attempt (its latest attempt with cards by default), the "default" card first."""
    found = _attempts(store, flow, run_id, step, task_id)
    if not found:
        return []
    a = max(found) if attempt is None else int(attempt)
    ids = sorted(found.get(a, []), key=lambda i: (i != "default", i))
    return [CardRef(flow, run_id, step, task_id, a, i) for i in ids]
