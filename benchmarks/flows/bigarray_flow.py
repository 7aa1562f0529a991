"""Benchmark flow: one step makes a large numpy array (default 512 MB), the next reads it (written for Metaflow)."""

import numpy as np
from metaflow import FlowSpec, Parameter, step


class BigArrayFlow(FlowSpec):
    """start builds `mb` MB of random float32 values; check reads the whole array back and verifies it."""

    mb = Parameter("mb", default=512, type=int, help="array size in MB")

    @step
    def start(self):
        n = self.mb * 2**20 // 4
        self.arr = np.random.default_rng(0).random(n, dtype=np.float32)
        self.probe_index = n // 2 + 7
        self.probe_value = float(self.arr[self.probe_index])
        self.total = float(self.arr.sum(dtype=np.float64))
        self.next(self.check)

    @step
    def check(self):
        arr = self.arr
        assert arr.dtype == np.float32 and arr.nbytes == self.mb * 2**20, (arr.dtype, arr.nbytes)
        assert float(arr[self.probe_index]) == self.probe_value
        assert float(arr.sum(dtype=np.float64)) == self.total  # touches every byte of the array
        print("array ok:", arr.nbytes // 2**20, "MB")
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    BigArrayFlow()
