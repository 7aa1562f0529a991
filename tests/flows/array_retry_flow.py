"""A foreach whose element 0 fails once while its siblings are still running (an array element's retry)."""

import time

from stoker import FlowSpec, current, retry, step


class ArrayRetryFlow(FlowSpec):
    @step
    def start(self):
        self.items = [0, 1, 2]
        self.next(self.work, foreach="items")

    @retry(times=1, minutes_between_retries=0)
    @step
    def work(self):
        if self.input == 0 and current.retry_count == 0:
            raise RuntimeError("element 0 fails once")
        if self.input:
            time.sleep(3)  # still running when element 0 is retried
        self.value = self.input * 10
        self.next(self.join)

    @step
    def join(self, inputs):
        self.values = sorted(i.value for i in inputs)
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    ArrayRetryFlow()
