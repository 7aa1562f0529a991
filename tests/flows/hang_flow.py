"""A deliberately deadlocked @torchrun gang (tests/integration/test_hangs*.py): rank 1 never joins the all_reduce that
rank 0 waits in (gloo, whose own timeout is 30 min), so nothing ends it but stoker's hang detection."""

import os

from stoker import FlowSpec, Parameter, current, step, torchrun


class HangFlow(FlowSpec):
    nodes = Parameter("nodes", default=1, type=int)
    nproc = Parameter("nproc", default=2, type=int)

    @step
    def start(self):
        self.next(self.train, num_parallel=self.nodes)

    @torchrun
    @step
    def train(self):
        worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hang_worker.py")
        current.torch.run(entrypoint=worker, nproc_per_node=self.nproc // self.nodes)
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    HangFlow()
