"""`@card(type="default", id=None, options=None, refresh_interval=5)`: the step's report, as Metaflow's @card.

Before every step `current.card` is set (stoker.cards.runtime), whether the step has a @card or not; after it,
on success and on failure, the step's cards are written to the store. Writing a card never fails the step.
"""

from __future__ import annotations

from stoker.errors import ConfigError
from stoker.features.hooks import every_task
from stoker.flow.decorators import StepDecorator, TaskContext, make_step_decorator


class CardDecorator(StepDecorator):
    """A card for the step (Metaflow's @card): `type` "default" (the task's artifacts and your components) or
    "blank" (your components only); `id` names it when a step has several; `refresh_interval` (s) rate-limits
    `current.card.refresh()`; `options` {"title": ...}; `timeout` is accepted for Metaflow compatibility."""

    name = "card"
    defaults = {"type": "default", "id": None, "options": None, "timeout": 45, "refresh_interval": 5,
                "save_errors": True}
    allow_multiple = True

    def validate(self) -> None:
        if self.attributes["type"] not in ("default", "blank"):
            raise ConfigError(f"@card(type={self.attributes['type']!r}): stoker has the card types 'default' and "
                              f"'blank'; build custom content with components (stoker.cards)")
        cid = self.attributes["id"]
        if cid is not None and (not isinstance(cid, str) or not cid.replace("_", "a").replace("-", "a").isalnum()):
            raise ConfigError(f"@card(id={cid!r}): use letters, digits, '_' and '-' only, e.g. id=\"training\"")
        if self.attributes["options"] is not None and not isinstance(self.attributes["options"], dict):
            raise ConfigError("@card(options=...) takes a dict, e.g. options={\"title\": \"Training\"}")
        self._number("refresh_interval", kind=float)
        self._number("timeout", kind=float)


class TaskCards(StepDecorator):
    """Every task has `current.card`, as in Metaflow (without @card, what is appended to it is dropped with a
    warning); the step's @card decorators' cards are written when the attempt ends."""

    name = "cards"
    order = 45  # started after @monitor's sampler, written before it stops

    @staticmethod
    def preload() -> None:
        from stoker.cards import runtime  # noqa: F401  (platform, uuid, html: ~10 ms)

    def task_started(self, ctx: TaskContext) -> None:
        from stoker.cards.runtime import start_task_cards

        ctx.state["card"] = start_task_cards(ctx.func, ctx.spec, ctx.store)  # the step's @card decorators

    def task_finished(self, ctx: TaskContext) -> None:
        cards = ctx.state.pop("card", None)
        if cards is not None:
            cards.finish(ctx.manifest.get("artifacts"), ctx.manifest)  # never raises; also on failure


every_task(TaskCards())
card = make_step_decorator(CardDecorator)
