"""A step that signs its results with another key than the store's (as a node configured with the wrong
STOKER_STORE_KEY would): the scheduler must say the manifest cannot be trusted, not "exit code 0"."""

import os

from stoker import FlowSpec, step


class OtherKeyFlow(FlowSpec):
    @step
    def start(self):
        os.environ["STOKER_STORE_KEY"] = "a-key-that-is-not-the-store-s-key-0123456789"
        self.x = 1
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    OtherKeyFlow()
