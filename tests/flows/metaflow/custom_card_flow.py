"""Custom card types (card_ext/metaflow_extensions/...): ids, options, customize, runtime data, errors, time limits."""

from metaflow import FlowSpec, card, current, step
from metaflow.cards import Markdown


class CustomCardFlow(FlowSpec):
    @card(type="compat_report", id="report", options={"title": "Scores"})
    @card(type="compat_report", id="custom", customize=True)
    @step
    def start(self):
        self.scores = {"a": 1, "b": 2}
        current.card.append(Markdown("# to the customize=True card"))
        current.card.append(Markdown("second"))
        current.card["report"].append(Markdown("to report"))
        self.next(self.middle)

    @card(type="compat_live", id="live", refresh_interval=0)
    @step
    def middle(self):
        current.card["live"].refresh({"n": 3})
        self.next(self.end)

    @card(type="compat_broken", id="broken")
    @card(type="compat_broken", id="quiet", save_errors=False)
    @card(type="compat_slow", id="slow", timeout=1)
    @card(type="compat_empty", id="empty")
    @card(type="compat_missing", id="missing")
    @step
    def end(self):
        self.done = True


if __name__ == "__main__":
    CustomCardFlow()
