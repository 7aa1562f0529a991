"""@retry, @catch, @timeout, @resources and @environment, as a Metaflow user combines them."""

import os
import time

from metaflow import FlowSpec, catch, current, environment, resources, retry, step, timeout


class DecoratorsFlow(FlowSpec):
    """Flaky and hanging steps that succeed on retry, a failing and a timing-out step that are caught, a plain one."""

    @step
    def start(self):
        self.next(self.flaky)

    @retry(times=2, minutes_between_retries=0)
    @step
    def flaky(self):
        self.attempt = current.retry_count
        if current.retry_count < 1:
            raise RuntimeError("transient failure")
        self.next(self.hangs_once)

    @retry(times=1, minutes_between_retries=0)
    @timeout(seconds=1)
    @step
    def hangs_once(self):
        self.hang_attempt = current.retry_count
        if current.retry_count == 0:
            time.sleep(30)  # the first attempt times out; the retry finishes at once
        self.next(self.failing)

    @catch(var="failure", print_exception=False)
    @step
    def failing(self):
        raise ValueError("boom")
        self.next(self.slow)

    @catch(var="timeout_failure")
    @timeout(seconds=1)
    @step
    def slow(self):
        time.sleep(30)
        self.next(self.fine)

    @catch(var="no_failure")
    @resources(cpu=1, memory=512)
    @environment(vars={"COMPAT_VAR": "from-environment"})
    @step
    def fine(self):
        self.env_value = os.environ.get("COMPAT_VAR")
        self.next(self.end)

    @step
    def end(self):
        self.saw_failure = self.failure is not None
        self.saw_timeout = self.timeout_failure is not None


if __name__ == "__main__":
    DecoratorsFlow()
