"""A step that needs 8 s after SIGTERM to finish (as a checkpoint would), then leaves a marker file: stopping it
must wait $STOKER_KILL_GRACE before the hard cancel."""

import os
import signal
import time
from pathlib import Path

from stoker import FlowSpec, step


class GracefulFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.nap)

    @step
    def nap(self):
        def finish(signum, frame):
            time.sleep(8)
            Path(os.environ["GRACE_MARKER"]).write_text("saved")
            os._exit(75)

        signal.signal(signal.SIGTERM, finish)
        print("napping", flush=True)
        time.sleep(120)
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    GracefulFlow()
