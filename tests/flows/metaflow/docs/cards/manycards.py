# From Metaflow's documentation, https://docs.metaflow.org/metaflow/visualizing-results/easy-custom-reports-with-card-components
# (github.com/Netflix/metaflow-docs docs/metaflow/visualizing-results/easy-custom-reports-with-card-components.md at 1d023210; Apache License 2.0). Verbatim below this header.
# ruff: noqa
from metaflow import FlowSpec, step, current, card
from metaflow.cards import Markdown

class ManyCardsFlow(FlowSpec):

    @card(type='blank', id='first')
    @card(type='blank', id='second')
    @step
    def start(self):
        current.card['first'].append(
            Markdown('# I am the first card'))
        current.card['second'].append(
            Markdown('# I am the second card'))
        self.next(self.end)

    @step
    def end(self):
        pass

if __name__ == '__main__':
    ManyCardsFlow()
