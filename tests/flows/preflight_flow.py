"""A @torchrun gang that checks its nodes before its command (distributed/preflight.py): each node stages a shard in
its temp folder, except `unstaged_node`, whose preflight then fails; a permanent failure, so @retry(times=2)
must not run it again."""

import os

from stoker import FlowSpec, Parameter, current, retry, step, torchrun


class PreflightFlow(FlowSpec):
    nodes = Parameter("nodes", default=2, type=int)
    nproc = Parameter("nproc", default=2, type=int)
    unstaged_node = Parameter("unstaged_node", default=-1, type=int, help="this node's staged data is missing")

    @step
    def start(self):
        self.next(self.train, num_parallel=self.nodes)

    @retry(times=2, minutes_between_retries=0)
    @torchrun
    @step
    def train(self):
        node = current.parallel.node_index
        print(f"node {node} attempt {current.retry_count}", flush=True)
        data = os.path.join(current.tempdir, "staged")
        if node != self.unstaged_node:
            os.makedirs(data)
            with open(os.path.join(data, "shard-0.bin"), "wb") as f:
                f.write(b"tokens")
        current.torch.run(entrypoint="stoker.train.collectives", nproc_per_node=self.nproc,
                          args=["--sizes", "4K", "--iters", "2", "--timeout", "60"], preflight_paths=[data])
        self.node, self.attempt = node, current.retry_count
        self.next(self.join)

    @step
    def join(self, inputs):
        self.attempts = sorted({i.attempt for i in inputs})
        self.next(self.end)

    @step
    def end(self):
        print("attempts", self.attempts)


if __name__ == "__main__":
    PreflightFlow()
