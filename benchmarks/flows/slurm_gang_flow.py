"""Benchmark flow for benchmarks/slurm.py: a 2-node `@torchrun` gang, one process per node.

    python benchmarks/flows/slurm_gang_flow.py run --args "--data DIR --out-dir OUT ..."
    python benchmarks/flows/slurm_gang_flow.py run --backend slurm=train --args "..."
    python benchmarks/flows/slurm_gang_flow.py run --entrypoint stoker.train.collectives --args "--out F ..."

`start` does nothing heavy (the dataset is prepared before the run). The gang runs a tiny `stoker.train`
(rank 0 appends a JSON line per step to OUT/metrics.jsonl: its first `time` is the first step) or the
gloo all_reduce check `stoker.train.collectives` (rank 0 writes --out after the first all_reduces).
"""

import shlex

from stoker import FlowSpec, Parameter, current, step, torchrun


class SlurmGangFlow(FlowSpec):
    """Time from `run` to the first training step of a gang."""

    nodes = Parameter("nodes", default=2, type=int, help="gang size (nodes)")
    entrypoint = Parameter("entrypoint", default="stoker.train", help="module each node runs under torchrun")
    args = Parameter("args", default="", help="its arguments, one shell-quoted string")

    @step
    def start(self):
        self.next(self.train, num_parallel=self.nodes)

    @torchrun(nproc_per_node=1)
    @step
    def train(self):
        current.torch.run(entrypoint=self.entrypoint, args=shlex.split(self.args))
        self.node = current.parallel.node_index
        self.next(self.join)

    @step
    def join(self, inputs):
        self.nodes_done = sorted(i.node for i in inputs)
        self.next(self.end)

    @step
    def end(self):
        print("gang ok:", self.nodes_done)


if __name__ == "__main__":
    SlurmGangFlow()
