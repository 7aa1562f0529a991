"""Hands numpy arrays, torch tensors (bf16, non-contiguous) and a state dict from one step to the next."""

import numpy as np

from stoker import FlowSpec, step


class TensorFlow(FlowSpec):
    @step
    def start(self):
        import torch

        g = torch.Generator().manual_seed(0)
        self.weights = torch.randn(64, 32, generator=g)
        self.half = torch.randn(16, 8, generator=g).to(torch.bfloat16)
        self.view = torch.arange(100.0).reshape(10, 10).t()  # non-contiguous
        self.state = {"w": torch.ones(3), "b": np.arange(4), "step": 7}
        self.array = np.random.default_rng(0).standard_normal((256, 128)).astype(np.float32)
        self.next(self.check)

    @step
    def check(self):
        import torch

        g = torch.Generator().manual_seed(0)
        assert torch.equal(self.weights, torch.randn(64, 32, generator=g))
        assert self.half.dtype == torch.bfloat16
        assert torch.equal(self.half, torch.randn(16, 8, generator=g).to(torch.bfloat16))
        assert torch.equal(self.view, torch.arange(100.0).reshape(10, 10).t())
        assert self.state["step"] == 7 and torch.equal(self.state["w"], torch.ones(3))
        self.total = float(self.array.sum())
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    TensorFlow()
