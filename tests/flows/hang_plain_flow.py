"""A plain task stuck in user code (tests/integration/test_hangs.py): its first attempt waits forever, its hang
timeout (@timeout(hang=3)) stops it as `hang`, and @retry runs it again; the second attempt finishes."""

import threading

from stoker import FlowSpec, current, retry, step, timeout


def wait_for_a_lock_nobody_releases():
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()


class HangPlainFlow(FlowSpec):
    @retry(times=1, minutes_between_retries=0)
    @timeout(hang=3)
    @step
    def start(self):
        print("starting", flush=True)
        if current.retry_count == 0:
            wait_for_a_lock_nobody_releases()
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    HangPlainFlow()
