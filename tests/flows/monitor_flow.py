"""@monitor on a step that sleeps and burns CPU in a child process; @neuron_monitor on a step that sleeps."""

import subprocess
import sys
import time

from stoker import FlowSpec, monitor, neuron_monitor, step

BURN = "import time\nend = time.time() + 0.8\nwhile time.time() < end: pass\n"


class MonitorFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.work)

    @monitor(interval=0.2)
    @step
    def work(self):
        time.sleep(0.7)
        subprocess.run([sys.executable, "-c", BURN], check=True)  # a child of the task: its CPU counts
        self.done = True
        self.next(self.neuron)

    @neuron_monitor(interval=0.2)
    @step
    def neuron(self):
        time.sleep(1.5)
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    MonitorFlow()
