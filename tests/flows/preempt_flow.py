"""Exit codes the scheduler acts on: a preempted step (75) is retried without @retry and resumes from its
"checkpoint"; a ConfigError (78) is not retried even under @retry; a step that ignores SIGTERM (for the reaper)."""

import os
import signal
import time
from pathlib import Path

from stoker import FlowSpec, Parameter, current, retry, step
from stoker.errors import ConfigError, Preempted


class PreemptFlow(FlowSpec):
    mode = Parameter("mode", default="preempt")
    scratch = Parameter("scratch", default="")

    @step
    def start(self):
        self.next(self.work)

    @retry(times=3, minutes_between_retries=0)
    @step
    def work(self):
        ckpt = Path(self.scratch) / "ckpt"
        if self.mode == "preempt":
            done = int(ckpt.read_text()) if ckpt.exists() else 0  # "resume from the checkpoint"
            self.resumed_from = done
            for i in range(done, 6):
                if i == 3 and current.retry_count == 0:  # a SIGTERM arrived: checkpoint, exit "retry and resume"
                    ckpt.write_text(str(i))
                    raise Preempted(f"stopped by SIGTERM after step {i}", step=i)
            self.steps = 6
        elif self.mode == "exit75":
            if current.retry_count < 2:
                os._exit(75)  # a script's way to say it: the exit code alone
            self.steps = 6
        elif self.mode == "config":
            raise ConfigError("train.stepz is not a setting; did you mean train.steps?")
        elif self.mode == "stubborn":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            (Path(self.scratch) / "pid").write_text(str(os.getpid()))
            time.sleep(300)
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    PreemptFlow()
