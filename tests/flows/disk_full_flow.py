"""A run whose last step fills the file system of $DISK_FULL_FILLER (issue 27): the run ends, but the record of
its end (a large run.json: its config, which the record keeps whole) no longer fits."""

import os

from stoker import Config, FlowSpec, step

# a large run record (its config values, kept whole; a long parameter is shown short): rewriting it at the end
# needs more room than the end step leaves
BALLAST = {"x": "x" * 400_000}


class DiskFullFlow(FlowSpec):
    ballast = Config("ballast", default_value=BALLAST)

    @step
    def start(self):
        self.next(self.end)

    @step
    def end(self):
        # fill the file system but for what this task still writes (its artifacts, manifest and logs)
        filler = os.environ["DISK_FULL_FILLER"]
        st = os.statvfs(os.path.dirname(filler))
        room = st.f_bavail * st.f_frsize - int(os.environ.get("DISK_FULL_KEEP", "131072"))
        with open(filler, "wb") as f:
            f.write(b"\0" * max(room, 0))
        print("filled", room, flush=True)


if __name__ == "__main__":
    DiskFullFlow()
