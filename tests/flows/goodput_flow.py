"""Trains the tiny model under @torchrun (a gang of `nodes` nodes x 1 process) with a checkpoint every 4 steps; on
attempt 0 node 0 SIGKILLs its own trainer once a checkpoint is committed and two more steps are done, so the retried
gang resumes from that checkpoint. tests/integration/test_goodput_flow.py reads the run's goodput ledger."""

import os
import signal
import threading
import time
from pathlib import Path

import psutil

from stoker import FlowSpec, Parameter, current, retry, step, torchrun


def latest_step(ckpt: Path) -> int:
    try:
        return int((ckpt / "latest").read_text().strip().rsplit("_", 1)[1])
    except (OSError, ValueError, IndexError):
        return -1


def logged_step(metrics: Path) -> int:
    try:
        lines = metrics.read_text().splitlines()
    except OSError:
        return -1
    return int(lines[-1].split('"step": ')[1].split(",")[0]) if lines else -1


def kill_mid_training(ckpt: Path, metrics: Path) -> None:
    """SIGKILL this task's trainer once a checkpoint is committed and it is at least 2 steps past it."""
    deadline = time.time() + 600
    while time.time() < deadline:
        committed = latest_step(ckpt)
        if committed > 0 and logged_step(metrics) >= committed + 2:
            for p in psutil.Process().children(recursive=True):
                cmd = " ".join(p.cmdline())
                if p.name().startswith("stoker-rank") or ("stoker.train" in cmd and "torch.distributed.run" not in cmd):
                    print(f"goodput_flow: killing the trainer (pid {p.pid}) after step {logged_step(metrics)}, "
                          f"checkpoint {committed} committed", flush=True)
                    p.send_signal(signal.SIGKILL)
                    return
        time.sleep(0.01)


class GoodputFlow(FlowSpec):
    data = Parameter("data", type=str, required=True)
    steps = Parameter("steps", type=int, default=60)
    nodes = Parameter("nodes", type=int, default=1)
    ckpt = Parameter("ckpt", type=str, default="", help="the checkpoint folder (default: ./ckpt/RUN)")

    @step
    def start(self):
        self.next(self.train, num_parallel=self.nodes)

    @retry(times=1, minutes_between_retries=0)
    @torchrun(nproc_per_node=1)
    @step
    def train(self):
        ckpt = Path(self.ckpt or os.path.abspath(os.path.join("ckpt", current.run_id)))
        out = Path(current.tempdir) / "train"
        sets = [f"data.url={self.data}", "data.block_size=33", f"train.steps={self.steps}", "train.micro_batch_size=4",
                "train.log_every=1", "metrics.progress=false", "metrics.tensorboard=false", "checkpoint.every=4",
                f"checkpoint.dir={ckpt}", f"out_dir={out}"]
        if current.retry_count == 0 and current.parallel.node_index == 0:
            threading.Thread(target=kill_mid_training, args=(ckpt, out / "metrics.jsonl"), daemon=True).start()
        current.torch.run(entrypoint="stoker.train", args=[f"--set={s}" for s in sets])
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    GoodputFlow()
