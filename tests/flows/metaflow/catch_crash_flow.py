"""@catch on tasks whose process dies (SIGKILL, a segfault) and on one that raises: the flow goes on."""

import ctypes
import os

from metaflow import FlowSpec, catch, retry, step


class CatchCrashFlow(FlowSpec):
    """Three branches fail three ways under @catch (one also with @retry); the join reads what @catch stored."""

    @step
    def start(self):
        self.base = 1
        self.next(self.killed, self.segv, self.raised)

    @catch(var="err")
    @retry(times=1, minutes_between_retries=0)
    @step
    def killed(self):
        self.partial = "never stored"
        os.kill(os.getpid(), 9)
        self.next(self.join)

    @catch(var="err")
    @step
    def segv(self):
        ctypes.string_at(0)
        self.next(self.join)

    @catch(var="err", print_exception=False)
    @step
    def raised(self):
        raise ValueError("boom")
        self.next(self.join)

    @step
    def join(self, inputs):
        self.caught = {name: [getattr(inputs, name).err.type, str(getattr(inputs, name).err.exception)]
                       for name in ("killed", "segv", "raised")}
        self.partial_kept = hasattr(inputs.killed, "partial")
        self.base_kept = inputs.killed.base
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    CatchCrashFlow()
