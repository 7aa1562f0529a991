"""Inherited artifacts changed in place: a later step's `self.d["k"] = v`, `self.l.append(x)` and `arr[0] = x`
are stored, an artifact read and deleted is passed on as its parent stored it, a join stores what it changed of a
merged artifact but not what it changed of an input's."""

import numpy as np
from metaflow import FlowSpec, step


class InPlaceFlow(FlowSpec):
    """start sets them; a changes them in place; b and c change one each; join merges the rest; end reads all."""

    @step
    def start(self):
        self.d = {"start": 1}
        self.l = [1]
        self.arr = np.zeros(3)
        self.gone = [1]
        self.n = 1
        self.keep = {"k": 1}
        self.extra = [0]
        self.untouched = {"u": 1}
        self.next(self.a)

    @step
    def a(self):
        self.d["a"] = 2
        self.l.append(2)
        self.arr[0] = 7.0
        self.gone.append(2)
        del self.gone  # this step's value is dropped
        self.n += 1  # read and reassigned
        self.seen = [self.keep["k"], self.gone]  # read, unchanged; `gone` read again after the del
        self.next(self.b, self.c)

    @step
    def b(self):
        self.d["b"] = 3
        self.l_in_b = list(self.l)
        self.next(self.join)

    @step
    def c(self):
        self.l.append(3)
        self.next(self.join)

    @step
    def join(self, inputs):
        inputs.b.extra.append(5)  # an input's artifact changed in place: not stored
        inputs.c.d["c"] = 4
        self.d = inputs.b.d
        self.l = inputs.c.l
        self.merge_artifacts(inputs, exclude=["d", "l", "l_in_b"])
        self.keep["join"] = 2  # a merged artifact changed in place: stored
        self.next(self.end)

    @step
    def end(self):
        self.result = {"d": self.d, "l": self.l, "arr": self.arr.tolist(), "gone": self.gone, "n": self.n,
                       "keep": self.keep, "extra": self.extra, "untouched": self.untouched, "seen": self.seen}
        print(self.d, self.l)


if __name__ == "__main__":
    InPlaceFlow()
