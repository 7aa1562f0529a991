"""A failed gang attempt leaves no temp folder behind (issue 13): neither the task's `current.tempdir`
(`stoker-<step>-*`, also for the member the gang's fail-fast stops with SIGTERM) nor torchrun's own
`torchelastic_*` log folder. The run gets a TMPDIR of its own, so other users of /tmp do not matter."""

from __future__ import annotations

from stoker import Flow
from tests.helpers import run_flow

FLOW = '''
import os

from stoker import FlowSpec, current, step, torchrun

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")


class FailingGangFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train, num_parallel=2)

    @torchrun(nproc_per_node=1)
    @step
    def train(self):
        print("tempdir", current.tempdir, flush=True)
        current.torch.run(entrypoint=WORKER)
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    FailingGangFlow()
'''

WORKER = '''
import os, sys, time

if os.environ["RANK"] == "1":
    print("rank 1 fails", flush=True)
    sys.exit(3)
time.sleep(120)  # rank 0 is still busy when the gang is stopped
'''


def test_failed_torchrun_gang_leaves_no_temp_folders(tmp_path):
    (tmp_path / "flow.py").write_text(FLOW)
    (tmp_path / "worker.py").write_text(WORKER)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    p = run_flow(tmp_path / "flow.py", "run", cwd=tmp_path, env={"TMPDIR": str(tmp)}, check=False, timeout=180)
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stdout.count("tempdir ") == 2  # both members ran, so both made a temp folder
    run = Flow("FailingGangFlow").latest_run
    assert run.status == "failed"
    assert sorted(x.name for x in tmp.iterdir()) == []
