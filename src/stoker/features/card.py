"""`@card(type="default", id=None, options=None, timeout=45, save_errors=True, customize=False, refresh_interval=5)`:
the step's report, as Metaflow's @card; `type` is "default", "blank" or a custom card type (stoker.cards.card).

Before every step `current.card` is set (stoker.cards.runtime), whether the step has a @card or not; after it,
on success and on failure, the step's cards are written to the store. Writing a card never fails the step.
"""

from __future__ import annotations

import re

from stoker.errors import ConfigError
from stoker.features.hooks import every_task
from stoker.flow.decorators import StepDecorator, TaskContext, make_step_decorator
from stoker.flow.mutables import step_functions

TYPE_PATTERN = re.compile(r"^[a-zA-Z0-9_]+$")  # Metaflow's card type pattern (stoker.cards.card has the same)


class CardDecorator(StepDecorator):
    """A card for the step (Metaflow's @card): `type` "default" (the task's artifacts and your components),
    "blank" (your components only) or a custom card type (a `MetaflowCard` subclass, see stoker.cards.card);
    `id` names it when a step has several; `options` go to the card ({"title": ...} for the built-in types);
    `timeout` (s) limits a custom card's render; `save_errors` stores Metaflow's error card when it fails;
    `customize=True` makes it the card `current.card.append` goes to; `refresh_interval` (s) rate-limits
    `current.card.refresh()`. `rank` and `scope` are accepted, as Metaflow does, and unused."""

    name = "card"
    defaults = {"type": "default", "id": None, "options": None, "timeout": 45, "refresh_interval": 5,
                "save_errors": True, "customize": False, "rank": None, "scope": "task"}
    allow_multiple = True

    def validate(self) -> None:
        t = self.attributes["type"]
        if not isinstance(t, str) or not TYPE_PATTERN.match(t):
            raise ConfigError(f"@card(type={t!r}): a card type is letters, digits and '_' (e.g. 'default', "
                              f"'blank' or your MetaflowCard subclass's `type`)")
        cid = self.attributes["id"]
        if cid is not None and (not isinstance(cid, str) or not cid.replace("_", "a").replace("-", "a").isalnum()):
            raise ConfigError(f"@card(id={cid!r}): use letters, digits, '_' and '-' only, e.g. id=\"training\"")
        if self.attributes["options"] is not None and not isinstance(self.attributes["options"], dict):
            raise ConfigError("@card(options=...) takes a dict, e.g. options={\"title\": \"Training\"}")
        self._number("refresh_interval", kind=float)
        if self.attributes["timeout"] is not None:
            v = self.attributes["timeout"]
            if isinstance(v, bool) or not isinstance(v, (int, float, str)):
                raise ConfigError(f"@card(timeout={v!r}): give seconds, e.g. timeout=45")
            try:
                float(v)
            except ValueError:
                raise ConfigError(f"@card(timeout={v!r}): give seconds, e.g. timeout=45") from None


class TaskCards(StepDecorator):
    """`current.card` in a task whose step has a @card (as in Metaflow, a step without one has no `current.card`);
    the step's @card decorators' cards are written when the attempt ends."""

    name = "cards"
    order = 45  # started after @monitor's sampler, written before it stops

    @staticmethod
    def preload(flow_cls: type | None = None) -> None:
        from stoker.cards import runtime

        if flow_cls is None or any(d.name == "card" for f in step_functions(flow_cls)
                                     for d in getattr(f, "decorators", [])):
            runtime.preload_renderers()  # (platform, uuid, html: ~10 ms; a flow without @card never needs them)

    def task_started(self, ctx: TaskContext) -> None:
        from stoker.cards.runtime import start_task_cards

        ctx.state["card"] = start_task_cards(ctx.func, ctx.spec, ctx.store, ctx.flow)  # the step's @card decorators

    def task_finished(self, ctx: TaskContext) -> None:
        cards = ctx.state.pop("card", None)
        if cards is not None:
            cards.finish(ctx.manifest.get("artifacts"), ctx.manifest)  # never raises; also on failure


every_task(TaskCards())
card = make_step_decorator(CardDecorator)
