"""Trains the tiny model under @torchrun (a gang of `nodes` nodes x 1 process) with one hot spare and a checkpoint
every 4 steps (and, with $SPARES_FLOW_EVICT=1, a straggler evicted); each node prints its member and pid so a test
can kill one from outside mid-training (the spare takes its place in the same job: tests/integration/test_spares.py
and the Slurm and Batch ones; benchmarks/recovery.py)."""

import os
from pathlib import Path

from stoker import FlowSpec, Parameter, current, retry, step, torchrun

EVICT = os.environ.get("SPARES_FLOW_EVICT") == "1"  # a test turns straggler eviction on (the driver reads it too)
SPARES = int(os.environ.get("SPARES_FLOW_SPARES", "1"))  # benchmarks/recovery.py compares with 0 (whole-gang retry)


class SparesFlow(FlowSpec):
    data = Parameter("data", type=str, required=True)
    steps = Parameter("steps", type=int, default=120)
    nodes = Parameter("nodes", type=int, default=2)
    ckpt = Parameter("ckpt", type=str, default="", help="the checkpoint folder (default: ./ckpt/RUN)")
    out = Parameter("out", type=str, default="", help="the trainer's out_dir (default: the task's tempdir)")

    @step
    def start(self):
        self.next(self.train, num_parallel=self.nodes)

    @retry(times=1, minutes_between_retries=0)
    @torchrun(nproc_per_node=1, spares=SPARES, evict_stragglers=EVICT)
    @step
    def train(self):
        par = current.parallel
        print(f"spares_flow: node {par.node_index} member {par.member} pid {os.getpid()} attempt "
              f"{current.retry_count}", flush=True)
        ckpt = Path(self.ckpt or os.path.abspath(os.path.join("ckpt", current.run_id)))
        sets = [f"data.url={self.data}", "data.block_size=33", f"train.steps={self.steps}", "train.micro_batch_size=4",
                "train.log_every=1", "metrics.progress=false", "metrics.tensorboard=false", "checkpoint.every=4",
                f"checkpoint.dir={ckpt}", f"out_dir={self.out or Path(current.tempdir) / 'train'}"]
        current.torch.run(entrypoint="stoker.train", args=[f"--set={s}" for s in sets])
        self.member = par.node_index if par.member is None else par.member
        self.next(self.join)

    @step
    def join(self, inputs):
        self.members = sorted(i.member for i in inputs)
        self.next(self.end)

    @step
    def end(self):
        print(f"spares_flow: nodes ran on members {self.members}", flush=True)


if __name__ == "__main__":
    SparesFlow()
