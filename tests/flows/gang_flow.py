"""A gang of num_parallel nodes; node FAIL_NODE fails on attempt 0 (exit 1 or SIGKILL, or freezes: SIGSTOP, as a hung
host whose heartbeat stops) and the retry succeeds."""

import os
import signal
import time

from stoker import FlowSpec, Parameter, current, parallel, retry, step


class GangFlow(FlowSpec):
    nodes = Parameter("nodes", default=3, type=int)
    fail_node = Parameter("fail_node", default=-1, type=int)
    how = Parameter("how", default="exit", help="exit | kill | freeze")
    retries = Parameter("retries", default=1, type=int)

    @step
    def start(self):
        self.next(self.work, num_parallel=self.nodes)

    @retry(times=1, minutes_between_retries=0)
    @parallel
    @step
    def work(self):
        p = current.parallel
        self.node = p.node_index
        self.num_nodes = p.num_nodes
        self.attempt = current.retry_count
        self.main_ip = p.main_ip
        print(f"node {p.node_index}/{p.num_nodes} attempt {current.retry_count} pid {os.getpid()}", flush=True)
        if p.node_index == self.fail_node and current.retry_count == 0:
            time.sleep(0.5)
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.how == "freeze":
                os.kill(os.getpid(), signal.SIGSTOP)
            raise RuntimeError(f"node {p.node_index} fails on purpose")
        if self.fail_node >= 0 and current.retry_count == 0:
            time.sleep(60)  # the others would wait here; the gang must be stopped long before this ends
        self.next(self.join)

    @step
    def join(self, inputs):
        self.nodes_seen = sorted(i.node for i in inputs)
        self.attempts = sorted({i.attempt for i in inputs})
        self.next(self.end)

    @step
    def end(self):
        print("nodes", self.nodes_seen, "attempts", self.attempts)


if __name__ == "__main__":
    GangFlow()
