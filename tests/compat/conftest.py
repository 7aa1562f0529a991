"""Fixtures of the side-by-side compatibility suite: real Metaflow in a venv, stoker from this checkout.

The Metaflow venv is $STOKER_METAFLOW_VENV, else the orchestration benchmark's cache
(~/.cache/stoker-bench/metaflow-venv); it is created once with `pip install metaflow==METAFLOW_VERSION numpy`.
With $STOKER_COMPAT_REPORT set, every `compare` appends one JSON line there (scripts/metaflow_compat_report.py
turns them into docs/metaflow-compat.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from benchmarks.orchestration import DEFAULT_VENV, ensure_metaflow_venv, venv_python

from tests.compat.engines import ENGINES, Engine, FlowRun, run_flow, stoker_engine

METAFLOW_VERSION = "2.19.39"



@pytest.fixture(scope="session")
def engines() -> dict[str, Engine]:
    venv = Path(os.environ.get("STOKER_METAFLOW_VENV") or DEFAULT_VENV)
    version = ensure_metaflow_venv(venv, f"metaflow=={METAFLOW_VERSION}")
    assert version == METAFLOW_VERSION, f"{venv} has metaflow {version}; delete it to get {METAFLOW_VERSION}"
    return {"metaflow": Engine("metaflow", str(venv_python(venv))), "stoker": stoker_engine()}


@pytest.fixture(scope="module")
def both(engines, tmp_path_factory) -> Callable[..., dict[str, FlowRun]]:
    """`both(flow, *args, key=..., **kw)`: the flow run once per engine (cached per module under `key`)."""
    cache: dict[str, dict[str, FlowRun]] = {}

    def get(flow: str, *args: str, key: str | None = None, **kw: Any) -> dict[str, FlowRun]:
        key = key or flow + "|" + " ".join(args)
        if key not in cache:
            base = tmp_path_factory.mktemp("compat")
            cache[key] = {name: run_flow(engines[name], flow, base / name, *args, **kw) for name in ENGINES}
        return cache[key]

    return get


def compare(request: pytest.FixtureRequest, what: str, got: dict[str, Any], expected: Any = None,
            check: Callable[[Any], bool] | None = None) -> None:
    """Assert both engines gave `expected` (or satisfy `check`, or, with neither, the same value).

    `what` says in words what is compared; with $STOKER_COMPAT_REPORT it is recorded with each engine's verdict.
    """
    if check is not None:
        verdict = {name: bool(check(value)) for name, value in got.items()}
    elif expected is not None:
        verdict = {name: value == expected for name, value in got.items()}
    else:
        same = len({json.dumps(v, sort_keys=True, default=str) for v in got.values()}) == 1
        verdict = {name: same for name in got}
    if path := os.environ.get("STOKER_COMPAT_REPORT"):
        doc = (request.function.__doc__ or "").strip().splitlines()
        with open(path, "a") as f:
            f.write(json.dumps({"test": request.node.nodeid, "module": request.module.__name__.rsplit(".", 1)[-1],
                                "module_doc": (request.module.__doc__ or "").strip().splitlines()[0],
                                "doc": doc[0] if doc else "", "what": what, "verdict": verdict,
                                "values": got}, default=str) + "\n")
    assert all(verdict.values()), f"{what}: " + "; ".join(f"{n}={got[n]!r}" for n in got) + \
        ("" if expected is None else f"; expected {expected!r}")


def outputs(runs: dict[str, FlowRun]) -> str:
    return "\n".join(f"--- {n} (exit {r.proc.returncode})\n{r.output[-3000:]}" for n, r in runs.items())
