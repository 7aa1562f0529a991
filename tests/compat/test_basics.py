"""Basics: static branches, merge_artifacts, the client's run and task data."""

from __future__ import annotations

import pytest

from tests.compat.conftest import compare, outputs

pytestmark = pytest.mark.slow


def test_branch_flow_results(both, request):
    """A flow with two splits and two joins ends with the same artifacts on both engines."""
    runs = both("branch_flow.py")
    compare(request, "exit status", {n: r.proc.returncode for n, r in runs.items()}, 0)
    got = {n: r.client("""
        from metaflow import Flow
        run = Flow("BranchFlow").latest_run
        result = {"summary": run.data.summary, "successful": run.successful,
                  "steps": sorted(s.id for s in run)}
    """) for n, r in runs.items()}
    compare(request, "end artifacts and steps", got)
    assert got["stoker"]["summary"] == "shared:[1, 2]:20:same", outputs(runs)
