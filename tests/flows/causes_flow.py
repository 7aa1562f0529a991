"""One failure a mode, for failure attribution (issue 25): each attempt of `work` fails the way `mode` says, on the
attempts listed in `fail_on` (all of them when empty), and succeeds on the others."""

import os
import signal
import sys
import time

from stoker import FlowSpec, Parameter, current, retry, step, timeout
from stoker.errors import ConfigError, StokerError

CUDA_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
            "79.10 GiB of which {free} GiB is free.")


class CausesFlow(FlowSpec):
    mode = Parameter("mode", default="user", help="kill | oom | config | user | flaky | timeout")
    fail_on = Parameter("fail_on", default="", help="the attempts that fail, e.g. '0' (default: every one)")

    @step
    def start(self):
        self.next(self.work)

    @retry(times=2, minutes_between_retries=0)
    @timeout(seconds=3)
    @step
    def work(self):
        n = current.retry_count
        self.attempt = n
        if not self.fail_on or str(n) in self.fail_on.split(","):
            self._fail(n)
        self.next(self.end)

    def _fail(self, n):
        if self.mode == "kill":  # a task killed from outside: nothing says who sent the signal
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.mode == "oom":  # a worker's CUDA OOM in the log, then the launcher's generic failure
            print(CUDA_OOM.format(free=1.19 - n / 100), file=sys.stderr, flush=True)
            raise StokerError("torchrun exited with code 1 on node 0 (torchrun ... -m stoker.train)")
        elif self.mode == "config":
            raise ConfigError("train.stepz is not a setting; did you mean train.steps?")
        elif self.mode == "user":
            raise ValueError("the same bug every time")
        elif self.mode == "flaky":
            raise ValueError(f"a different failure on attempt {n}")
        elif self.mode == "timeout":
            time.sleep(30)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    CausesFlow()
