"""foreach with self.input and self.index, joined in order."""

from metaflow import FlowSpec, step


class WordsFlow(FlowSpec):
    """One task per word; the join sees them in foreach order."""

    @step
    def start(self):
        self.words = ["a", "bb", "ccc", "dddd", "eeeee"]
        self.next(self.measure, foreach="words")

    @step
    def measure(self):
        self.word = self.input
        self.position = self.index
        self.length = len(self.input)
        self.next(self.join)

    @step
    def join(self, inputs):
        self.lengths = [inp.length for inp in inputs]
        self.positions = [inp.position for inp in inputs]
        self.merge_artifacts(inputs, exclude=["word", "position", "length"])
        self.next(self.end)

    @step
    def end(self):
        assert self.words == ["a", "bb", "ccc", "dddd", "eeeee"]
        self.total = sum(self.lengths)


if __name__ == "__main__":
    WordsFlow()
