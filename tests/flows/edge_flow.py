"""Edge cases that once broke stoker: a column-0 string in a step, a foreach over a class attribute, a foreach
variable set by a helper method, join inputs' .input/.index, `_private` artifacts, @catch var on success."""

from stoker import FlowSpec, Parameter, catch, step


class EdgeFlow(FlowSpec):
    letters = ["a", "b", "c"]
    mode = Parameter("mode", default="ok")

    def load(self):
        self.numbers = [10, 20]

    @catch(var="failure")
    @step
    def start(self):
        self.query = """
select 1
"""
        self._private = "kept"
        if self.mode == "assign-param":
            self.mode = "changed"
        self.next(self.per_letter, foreach="letters")

    @step
    def per_letter(self):
        self.letter = self.input
        self.next(self.join_letters)

    @step
    def join_letters(self, inputs):
        self.seen = [(i.index, i.input, i.letter) for i in inputs]
        self.merge_artifacts(inputs, exclude=["letter"])
        self.next(self.split_numbers)

    @step
    def split_numbers(self):  # a join does not split again (as in Metaflow)
        self.load()
        self.next(self.per_number, foreach="numbers")

    @step
    def per_number(self):
        self.doubled = 2 * self.input
        self.next(self.join_numbers)

    @step
    def join_numbers(self, inputs):
        self.doubled = [i.doubled for i in inputs]
        self.merge_artifacts(inputs, exclude=["doubled"])
        self.next(self.end)

    @step
    def end(self):
        assert self._private == "kept" and self.query.strip() == "select 1"


if __name__ == "__main__":
    EdgeFlow()
