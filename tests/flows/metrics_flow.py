"""Trains the tiny model under @torchrun (a gang of 1 node x 1 process) for 3 steps; attempt 0 stops after step 2 and
fails, so the retry resumes from its checkpoint and trains step 3. Its metrics must be in the store."""

import os

from stoker import FlowSpec, Parameter, current, retry, step, torchrun


class MetricsFlow(FlowSpec):
    data = Parameter("data", type=str, required=True)

    @step
    def start(self):
        self.next(self.train, num_parallel=1)

    @retry(times=1, minutes_between_retries=0)
    @torchrun(nproc_per_node=1)
    @step
    def train(self):
        first = current.retry_count == 0
        sets = [f"data.url={self.data}", "data.block_size=33", "train.steps=3", "train.micro_batch_size=4",
                "train.log_every=1", "metrics.progress=false",
                f"checkpoint.dir={os.path.abspath(os.path.join('ckpt', current.run_id))}",
                f"out_dir={os.path.join(current.tempdir, 'train')}"] + (["train.stop_after=2"] if first else [])
        current.torch.run(entrypoint="stoker.train", args=[f"--set={s}" for s in sets])
        if first:
            raise RuntimeError("attempt 0 stops after step 2 on purpose")
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    MetricsFlow()
