"""A gang of one node with a hot spare (so its rank is forked by the warm launcher, distributed/warm.py + zygote.py)
whose rank runs torch's thread pool and hashes a large buffer with stoker's hasher (tests/flows/fork_warm_worker.py):
tests/integration/test_fork_safety.py."""

import os

from stoker import FlowSpec, current, step, torchrun

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fork_warm_worker.py")


class ForkWarmFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train, num_parallel=1)

    @torchrun(nproc_per_node=1, spares=1)
    @step
    def train(self):
        current.torch.run(entrypoint=WORKER)
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        print("fork_warm_flow: done", flush=True)


if __name__ == "__main__":
    ForkWarmFlow()
