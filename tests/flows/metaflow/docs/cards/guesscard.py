# From Metaflow's documentation, https://docs.metaflow.org/metaflow/visualizing-results/easy-custom-reports-with-card-components
# (github.com/Netflix/metaflow-docs docs/metaflow/visualizing-results/easy-custom-reports-with-card-components.md at 1d023210; Apache License 2.0). Verbatim below this header.
# ruff: noqa
from metaflow import FlowSpec, step, card, Parameter, current
from metaflow.cards import Markdown

class GuessCardFlow(FlowSpec):

    number = Parameter('number', default=3)

    @card(type='blank')
    @step
    def start(self):
        current.card.append(Markdown("# Guess my number"))
        if self.number > 5:
            current.card.append(Markdown("My number is **smaller** ⬇️"))
        elif self.number < 5:
            current.card.append(Markdown("My number is **larger** ⬆️"))
        else:
            current.card.append(Markdown("## Correct! 🎉"))
        self.next(self.end)

    @step
    def end(self):
        pass

if __name__ == "__main__":
    GuessCardFlow()
