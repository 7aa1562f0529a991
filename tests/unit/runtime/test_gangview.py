"""Gang node states in the terminal: the line format, and that it shows only changes, at most once a second."""

from __future__ import annotations

import io
import re

from stoker.runtime.contract import RUNNING, JobRef, JobStatus
from stoker.runtime.driver.gangview import GangView, node_states
from stoker.runtime.driver.output import Display
from stoker.runtime.driver.scheduler import Task
from tests.helpers import run_flow


def _gang(ref: JobRef, n: int) -> list[Task]:
    return [Task(step="train", task_id=str(i), inputs=[], foreach=[], max_attempts=1, gang="g", state="running",
                 job=ref, member=i) for i in range(n)]


def test_node_states_from_tasks_and_member_statuses():
    ref = JobRef(backend="slurm", job_id="7", members=4, kind="gang")
    tasks = _gang(ref, 4)
    tasks[3].state = "ok"
    tasks[1].stopping = True
    status = JobStatus(RUNNING, members={0: JobStatus(RUNNING, started_at=1.0),
                                         2: JobStatus("queued", reason="Resources")})
    assert node_states(tasks, ref, status) == ["running", "stopping", "queued (Resources)", "done"]


def test_only_changes_at_most_once_a_second_and_always_the_end():
    view = GangView()
    assert view.line("j", "r/train", ["queued", "queued"], now=0.0) == \
        "[r/train] gang of 2 nodes: node 0 queued, node 1 queued"
    assert view.line("j", "r/train", ["queued", "queued"], now=5.0) is None  # unchanged
    assert view.line("j", "r/train", ["running", "queued"], now=5.0) is not None
    assert view.line("j", "r/train", ["running", "running"], now=5.5) is None  # under a second after the last
    assert view.line("j", "r/train", ["running", "running"], now=6.1) == \
        "[r/train] gang of 2 nodes: node 0 running, node 1 running"
    assert view.line("j", "r/train", ["done", "failed"], now=6.2) == \
        "[r/train] gang of 2 nodes: node 0 done, node 1 failed"
    assert view.shown == {}  # an ended gang is forgotten


def test_quiet_display_prints_no_gang_lines(capsys):
    from rich.console import Console

    buf = io.StringIO()
    loud = Display("f/1", console=Console(file=buf, width=200))
    loud.gang("j", "1/train", ["running", "queued (Priority)"], now=0.0)
    assert "gang of 2 nodes: node 0 running, node 1 queued (Priority)" in buf.getvalue()
    quiet_buf = io.StringIO()
    quiet = Display("f/1", quiet=True, console=Console(file=quiet_buf, width=200))
    quiet.gang("j", "1/train", ["running", "running"], now=0.0)
    assert quiet_buf.getvalue() == ""


def test_local_gang_run_shows_each_node_state(tmp_path):
    """A real 2-node gang on the local backend; node 1 works 3.5 s longer than node 0."""
    p = run_flow("gang_progress_flow.py", "run", cwd=tmp_path)
    lines = [ln for ln in p.stdout.splitlines() if re.search(r"/work\] gang of 2 nodes:", ln)]
    assert any(ln.endswith("gang of 2 nodes: node 0 running, node 1 running") for ln in lines), p.stdout
    assert any(ln.endswith("gang of 2 nodes: node 0 done, node 1 running") for ln in lines), p.stdout
    assert lines[-1].endswith("gang of 2 nodes: node 0 done, node 1 done"), p.stdout
    assert len(lines) <= 4  # only changes, not every poll


def test_local_gang_run_quiet_has_no_gang_lines(tmp_path):
    p = run_flow("gang_progress_flow.py", "run", "--quiet", cwd=tmp_path)
    assert "gang 2 nodes" not in p.stdout + p.stderr

