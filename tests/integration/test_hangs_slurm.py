"""Issue 33 item 3 on the localhost Slurm cluster (tests/slurm_cluster.py): a 2-node @torchrun gang (gloo, one rank a
node) whose rank 1 never joins the all_reduce rank 0 waits in. While it hangs, `stoker stacks` reaches both nodes
through the store and shows the stuck frames; then its nodes' watchdogs stop it as `hang` within the hang timeout,
with the stacks recorded and named in `stoker show`."""

from __future__ import annotations

import pytest

from stoker import Flow
from tests.helpers import FLOWS
from tests.integration.test_hangs import cli
from tests.integration.test_slurm_faults import _start, shared  # noqa: F401 - the fixture

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.torch]
HANG_S = 15


@pytest.mark.timeout(150)
def test_a_deadlocked_slurm_gang_shows_its_stacks_then_ends_as_hang(shared):  # noqa: F811
    proc, out = _start(FLOWS / "hang_flow.py", "--nodes", "2", "--hang-timeout", str(HANG_S), "--no-preflight",
                       "--backend", "slurm=train", cwd=shared)
    try:
        joined = max(out.wait_for("rank 1 joined", 90), out.wait_for("rank 0 joined", 10))
        run = Flow("HangFlow").latest_run
        p = cli("stacks", f"{run.pathspec}/train", cwd=shared)
        assert p.returncode == 0, p.stdout + p.stderr
        for frame in ("rank_one_never_joins", "rank_zero_waits_in_all_reduce", " rank 0 pid ", " rank 1 pid "):
            assert frame in p.stdout, p.stdout
        ended = out.wait_for("failed after 1 attempt", HANG_S + 40)
        assert proc.wait(60) == 1
    finally:
        if proc.poll() is None:
            cli("kill", Flow("HangFlow").latest_run.pathspec, cwd=shared)
            proc.wait(60)
    assert ended - joined < HANG_S + 10, f"stopped {ended - joined:.1f} s after the ranks' last output\n{out.text}"
    assert "cause: hang (no progress)" in out.text, out.text
    causes = [a.exception.cause for t in run["train"] for a in t.attempts if a.exception]
    assert "hang" in causes, causes
    stacks = cli("logs", f"{run.pathspec}/train", "--stacks", cwd=shared).stdout
    assert "rank_one_never_joins" in stacks and "rank_zero_waits_in_all_reduce" in stacks, stacks
    shown = " ".join(cli("show", run.pathspec, cwd=shared).stdout.split())
    assert "failed: hang (no progress)" in shown, shown
