"""Benchmark flow for benchmarks/goodput.py: a local 2-node `@torchrun` gang (one process per node) training the tiny
model with `stoker.train`, with one injected fault per run (`--fault`):

    kill    on attempt 0 node 1 SIGKILLs its own trainer (rank 1) once a checkpoint is committed and about a second
            of steps more are done; the retry resumes the gang from that checkpoint
    slow    rank 1 sleeps 0.2 s more than the others in every step (the straggler test hook STOKER_TEST_SLOW_RANK)
    config  a global batch that is no multiple of micro_batch_size x dp: a ConfigError, deterministic, not retried
    none    no fault

Every rank sleeps `--pad` seconds (0.02) in each step's compute (the same test hook): the tiny model's own step, about
5 ms, varies between two ranks on a shared 2-core machine by more than the straggler threshold, a real step does not
(tests/unit/train/test_stragglers_gang.py pads its equal gang the same way).

    python benchmarks/flows/goodput_bench_flow.py run --data tokens.bin --fault kill
"""

import os
import signal
import threading
import time
from pathlib import Path

import psutil

from stoker import FlowSpec, Parameter, current, retry, step, torchrun

FAULTS = ("none", "kill", "slow", "config")


def latest_step(ckpt: Path) -> int:
    try:
        return int((ckpt / "latest").read_text().strip().rsplit("_", 1)[1])
    except (OSError, ValueError, IndexError):
        return -1


def kill_after_a_checkpoint(ckpt: Path, delay: float) -> None:
    """SIGKILL this node's trainer ``delay`` seconds after the gang's first committed checkpoint."""
    deadline = time.time() + 600
    while time.time() < deadline and latest_step(ckpt) <= 0:
        time.sleep(0.01)
    time.sleep(delay)
    for p in psutil.Process().children(recursive=True):
        cmd = " ".join(p.cmdline())
        if "stoker.train" in cmd and "torch.distributed.run" not in cmd:
            print(f"goodput_bench: killing node 1's trainer (pid {p.pid}) {delay:g} s after checkpoint "
                  f"{latest_step(ckpt)}", flush=True)
            p.send_signal(signal.SIGKILL)
            return


class GoodputBench(FlowSpec):
    data = Parameter("data", type=str, required=True, help="a token file (.bin, uint16)")
    fault = Parameter("fault", default="none", help=f"one of {', '.join(FAULTS)}")
    steps = Parameter("steps", type=int, default=80)
    nodes = Parameter("nodes", type=int, default=2)
    every = Parameter("every", type=str, default="10", help="checkpoint.every (steps, or auto)")
    pad = Parameter("pad", type=float, default=0.02, help="seconds every rank sleeps in each step")

    @step
    def start(self):
        if self.fault not in FAULTS:
            raise ValueError(f"--fault {self.fault}: one of {FAULTS}")
        self.next(self.train, num_parallel=self.nodes)

    @retry(times=1, minutes_between_retries=0)
    @torchrun(nproc_per_node=1)
    @step
    def train(self):
        ckpt = Path(os.path.abspath(os.path.join("ckpt", current.run_id)))
        sets = [f"data.url={self.data}", "data.block_size=33", f"train.steps={self.steps}", "train.micro_batch_size=4",
                "train.log_every=5", "metrics.progress=false", "metrics.tensorboard=false",
                f"checkpoint.every={self.every}", f"checkpoint.dir={ckpt}", f"out_dir={current.tempdir}/train"]
        slow = 0.2 if self.fault == "slow" else 0.0
        env = {"STOKER_TEST_SLOW_RANK": f"0:{self.pad},1:{self.pad + slow}"}
        if self.fault == "config":
            sets.append("train.global_batch_size=6")  # micro 4 x dp 2 = 8 per step: no multiple of it
        elif self.fault == "kill" and current.retry_count == 0 and current.parallel.node_index == 1:
            threading.Thread(target=kill_after_a_checkpoint, args=(ckpt, 1.0), daemon=True).start()
        current.torch.run(entrypoint="stoker.train", args=[f"--set={s}" for s in sets], env=env)
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    GoodputBench()
