"""Artifacts across steps: inherited artifacts changed in place, deleted, reassigned, merged in a join."""

from __future__ import annotations

import pytest

from tests.compat.conftest import compare, outputs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def inplace(both):
    return both("inplace_flow.py")


def test_changed_in_place_reaches_later_steps(inplace, request):
    """A later step's `self.d["k"] = v`, `self.l.append(x)`, `self.arr[0] = x` reach the steps after it."""
    compare(request, "exit status", {n: r.proc.returncode for n, r in inplace.items()}, 0)
    assert all(r.ok for r in inplace.values()), outputs(inplace)
    got = {n: r.client("""
        from metaflow import Flow
        result = Flow("InPlaceFlow").latest_run["end"].task.data.result
    """) for n, r in inplace.items()}
    compare(request, "what the end step read", got, {
        "d": {"start": 1, "a": 2, "b": 3}, "l": [1, 2, 3], "arr": [7.0, 0.0, 0.0], "gone": [1], "n": 2,
        "keep": {"k": 1, "join": 2}, "extra": [0], "untouched": {"u": 1}, "seen": [1, [1]]})
    compare(request, "the end step's printed d and l",
            {n: "{'start': 1, 'a': 2, 'b': 3} [1, 2, 3]" in r.proc.stdout for n, r in inplace.items()}, True)


def test_each_task_stores_what_it_changed(inplace, request):
    """Each task stores what it changed in place; a deleted one is passed on as stored; a join's `inputs` are not.

    As the client reads them: a join stores its change of a merged artifact, not its change of an input's."""
    got = {n: r.client("""
        from metaflow import Flow
        run = Flow("InPlaceFlow").latest_run
        names = ["d", "l", "arr", "gone", "n", "keep", "extra", "untouched"]
        result = {}
        for s in ["start", "a", "b", "c", "join"]:
            data = run[s].task.data
            values = {k: getattr(data, k) for k in names}
            values["arr"] = values["arr"].tolist()
            result[s] = values
    """) for n, r in inplace.items()}
    base = {"d": {"start": 1}, "l": [1], "arr": [0.0, 0.0, 0.0], "gone": [1], "n": 1, "keep": {"k": 1},
            "extra": [0], "untouched": {"u": 1}}
    a = {**base, "d": {"start": 1, "a": 2}, "l": [1, 2], "arr": [7.0, 0.0, 0.0], "n": 2}
    compare(request, "artifacts of start, a, b, c and join", got, {
        "start": base, "a": a, "b": {**a, "d": {"start": 1, "a": 2, "b": 3}}, "c": {**a, "l": [1, 2, 3]},
        "join": {**a, "d": {"start": 1, "a": 2, "b": 3}, "l": [1, 2, 3], "keep": {"k": 1, "join": 2}}})
