"""Validate a cluster before training: every rank of an N-node gang all-reduces a known tensor.

    python examples/allreduce.py run                      # 2 nodes x 2 processes on this machine
    python examples/allreduce.py run --nodes 4 --sizes 1M,64M,1G   # on a cluster backend

Local rank 0 of each node prints `result OK`; node 0 stores latency and bus bandwidth per message size as the
artifact `results`. A wrong sum or a hang (--timeout) fails the gang within seconds.

The all_reduce is `stoker.train.collectives`, the same code a training gang's preflight runs before its command
(docs/operations.md, "Preflight"): NCCL on CUDA, XLA on Neuron when torch_xla is there (the Neuron DLC), gloo on
CPU; `--dist-backend` picks one. This step is that check itself, so it skips the preflight unless `--check-nodes`
(which adds the node checks: devices, EFA, imports, disk).
"""

import json
import os

from stoker import FlowSpec, Parameter, current, step, torchrun


class AllReduceFlow(FlowSpec):
    nodes = Parameter("nodes", default=2, type=int, help="gang size (nodes)")
    nproc = Parameter("nproc", default=2, type=int, help="processes per node")
    sizes = Parameter("sizes", default="4K,256K,4M", help="message sizes")
    iters = Parameter("iters", default=10, type=int)
    timeout = Parameter("timeout", default=120.0, type=float, help="fail if the test hangs this long (s)")
    extra = Parameter("extra", default="", help="more arguments for stoker.train.collectives")
    dist_backend = Parameter("dist_backend", default="auto", help="auto (nccl on CUDA, xla on Neuron, else gloo), "
                             "gloo, nccl or xla")
    check_nodes = Parameter("check_nodes", default=False, type=bool, help="run the gang's preflight node checks first")

    @step
    def start(self):
        self.next(self.allreduce, num_parallel=self.nodes)

    @torchrun
    @step
    def allreduce(self):
        out = os.path.join(current.tempdir, "allreduce.json")
        args = ["--sizes", self.sizes, "--iters", str(self.iters), "--timeout", str(self.timeout), "--out", out,
                "--backend", self.dist_backend]
        current.torch.run(entrypoint="stoker.train.collectives", nproc_per_node=self.nproc,
                          args=args + self.extra.split(), preflight=self.check_nodes)
        self.node = current.parallel.node_index
        self.results = json.load(open(out)) if os.path.exists(out) else None
        self.next(self.join)

    @step
    def join(self, inputs):
        self.report = next(i.results for i in inputs if i.results)
        self.next(self.end)

    @step
    def end(self):
        r = self.report
        print(f"all_reduce OK on {r['world_size']} ranks ({r['backend']})")
        for row in r["results"]:
            print(f"  {row['bytes']:>12,d} B  {row['latency_us']:10.1f} us  {row['busbw_gbps']:8.3f} GB/s")


if __name__ == "__main__":
    AllReduceFlow()
