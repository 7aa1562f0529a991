"""Trains the tiny model under @torchrun (a gang of 1 node x 2 processes) with rank 1 slowed by the test hook
STOKER_TEST_SLOW_RANK (set it when running the flow): its trainer names rank 1 a straggler in the task's metrics."""

import os

from stoker import FlowSpec, Parameter, current, step, torchrun


class StragglerFlow(FlowSpec):
    data = Parameter("data", type=str, required=True)

    @step
    def start(self):
        self.next(self.train, num_parallel=1)

    @torchrun(nproc_per_node=2)
    @step
    def train(self):
        sets = [f"data.url={self.data}", "data.block_size=33", "train.steps=12", "train.micro_batch_size=4",
                "train.log_every=2", "metrics.progress=false", "metrics.tensorboard=false",
                "checkpoint.save_final=false", f"out_dir={os.path.join(current.tempdir, 'train')}"]
        current.torch.run(entrypoint="stoker.train", args=[f"--set={s}" for s in sets])
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    StragglerFlow()
