"""`python flow.py dump RUN[/STEP[/TASK]]`: a task's artifacts as Metaflow's `dump` prints them, one line each:
``name [size: N type: <class 'T'>] = value``, values larger than ``--max-value-size`` shown as
``< artifact too large >``; ``--file`` pickles {"run/step/task": {name: value}} instead."""

from __future__ import annotations

import argparse
import pickle
import sys
from typing import Any

from stoker.cli.argtypes import non_negative_int
from stoker.errors import ConfigError

TOO_LARGE = "< artifact too large >"


def add_parser(sub: Any) -> None:
    """Register `dump` on the flow CLI's subparsers (Metaflow's options)."""
    p = sub.add_parser("dump", help="print the artifacts of RUN/STEP[/TASK] (or of every task of RUN)")
    p.add_argument("input_path", help="RUN/STEP or RUN/STEP/TASK (stoker also takes RUN)")
    p.add_argument("--private", action=argparse.BooleanOptionalAction, default=False,
                   help="show private artifacts (names starting with _) too")
    p.add_argument("--max-value-size", type=non_negative_int, default=1000,
                   help="show only values smaller than this many bytes (0: only names; default 1000)")
    p.add_argument("--include", default="", help="only these artifacts (a comma-separated list)")
    p.add_argument("--file", default=None, help="pickle the artifacts into this file instead of printing them")
    p.set_defaults(quiet=False)  # `python flow.py --quiet dump ...` sets it


def _tasks(flow: str, input_path: str) -> list[Any]:
    from stoker.client import Run, Task

    parts = input_path.strip("/").split("/")
    if parts and parts[0] == flow and len(parts) > 1:
        parts = parts[1:]
    if not 1 <= len(parts) <= 3 or not all(parts):
        raise ConfigError(f"dump {input_path}: input_path should either be run_id/step_name or "
                          f"run_id/step_name/task_id (or run_id for every task of the run)")
    if len(parts) == 3:
        return [Task(f"{flow}/{'/'.join(parts)}")]
    run = Run(f"{flow}/{parts[0]}")
    steps = [run[parts[1]]] if len(parts) == 2 else list(reversed(list(run)))
    return [t for s in steps for t in s]


def artifacts(task: Any, private: bool, max_value_size: int | None, include: set[str]) -> dict[str, Any]:
    """{name: value} of a task's artifacts, as Metaflow's ``to_dict`` (sorted, private and large ones left out)."""
    out: dict[str, Any] = {}
    for art in sorted(task.artifacts, key=lambda a: a.id):
        if (include and art.id not in include) or (art.id.startswith("_") and not private):
            continue
        size = art.size or 0
        too_large = max_value_size is not None and (size == 0 or size > max_value_size)
        out[art.id] = TOO_LARGE if too_large else art.data
    return out


def dump(flow: str, input_path: str, *, private: bool = False, max_value_size: int = 1000, include: str = "",
         file: str | None = None, quiet: bool = False) -> int:
    """Print (or pickle into ``file``) the artifacts of each task under ``input_path``."""
    wanted = {t for t in include.split(",") if t}
    tasks = _tasks(flow, input_path)
    pickled: dict[str, dict[str, Any]] = {}
    for task in tasks:
        if not quiet:
            print(f"Dumping output of run_id={task.run_id} step={task.step_name} task_id={task.id}", file=sys.stderr)
        values = artifacts(task, private, None if file else max_value_size, wanted)
        if file:
            pickled[f"{task.run_id}/{task.step_name}/{task.id}"] = values
            continue
        types = {a.id: a for a in task.artifacts}
        for name, value in values.items():
            art = types[name]
            print(f"{name} [size: {art.size or 0} type: <class '{art.type}'>] = {value}")
    if file:
        with open(file, "wb") as f:
            pickle.dump(pickled, f, protocol=pickle.HIGHEST_PROTOCOL)
        if not quiet:
            print(f"Artifacts written to {file}", file=sys.stderr)
    return 0
