"""The quickstart's wall time and its train step's start-up share, with warm ranks and as it ran before (issue 33).

    python benchmarks/quickstart.py                  # 3 runs as it runs now, 3 as before; ~10 min on 2 quiet cores
    python benchmarks/quickstart.py --runs 5 --no-before
    python benchmarks/quickstart.py --json

Each run is `stoker quickstart` (the packaged flow src/stoker/recipes/llama_pretrain.py on its embedded defaults:
prepare Shakespeare, a 2-node x 2-process gang trains 40 steps, evaluate, export) in a fresh STOKER_HOME, so data
preparation is part of every run. Per run it prints the wall time of the command and, from the goodput ledger of
its train step (`stoker goodput --json`), the start-up's share of the step's node-time and its parts (preflight,
imports, launch, trainer init). Then min / median / max of each, and the load average before and after the
runs (the machine may be shared: quote the numbers with it).

"now": the defaults (a local gang forks its ranks from a warm launcher started when the task starts; the preflight
on one host skips the all_reduce). "before" (`--no-before` skips it): STOKER_WARM_RANKS=0 (torchrun starts every
rank as a new Python) and STOKER_PREFLIGHT_ALLREDUCE=1 (the preflight's all_reduce, a torchrun and its workers per
node), as the quickstart ran before issue 33. The runs alternate (now, before, now, ...) so that a change of load
falls on both. Goal (issue 33): a run <= 60 s on 2 quiet cores, <= 2x that at load 10; start-up <= 30 % of the
train step's node-time. The exit status is non-zero when a run fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "src"
GOAL_S, GOAL_STARTUP = 60.0, 0.30
MODES = {"now": {}, "before": {"STOKER_WARM_RANKS": "0", "STOKER_PREFLIGHT_ALLREDUCE": "1"}}


@dataclass
class Result:
    mode: str
    ok: bool
    wall_s: float
    run: str = ""
    startup_share: float | None = None  # of the train step's node-time
    startup: dict[str, float] = field(default_factory=dict)  # its parts, node-seconds summed over the nodes
    train_s: float | None = None  # the train step's wall time
    mean_step_s: float | None = None  # its mean training step (the productive part: what start-up work cannot cut)
    load_before: str = ""
    load_after: str = ""


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def stoker(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    code = "import sys; from stoker.cli.main import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def train_ledger(r: Result, env: dict[str, str]) -> None:
    """The train step's start-up share of its node-time and its parts, its wall time and mean step, from
    `stoker goodput --json`."""
    p = stoker(["goodput", r.run, "--json"], env, 300)
    try:
        step = next(s for s in json.loads(p.stdout)["steps"] if s["step"] == "train")
    except (ValueError, KeyError, StopIteration):
        return
    parts: dict[str, float] = {}
    for task in step.get("tasks") or []:
        for attempt in task.get("attempts") or [task]:
            for k, v in (attempt.get("startup") or {}).items():
                parts[k] = parts.get(k, 0.0) + float(v)
    r.startup_share, r.startup = step["seconds"]["startup"] / step["node_seconds"], parts
    r.train_s, r.mean_step_s = step.get("wall_s"), step.get("mean_step_s")


def one(mode: str, base: dict[str, str], timeout: float) -> Result:
    home = tempfile.mkdtemp(prefix=f"stoker-quickstart-{mode}-")
    env = {**base, **MODES[mode], "STOKER_HOME": home}
    before = loadavg()
    t0 = time.monotonic()
    try:
        p = stoker(["quickstart"], env, timeout)
        out, ok = p.stdout + p.stderr, p.returncode == 0
    except subprocess.TimeoutExpired as e:
        out, ok = f"{e.stdout or ''}{e.stderr or ''}", False
    wall = time.monotonic() - t0
    r = Result(mode, ok, wall, load_before=before, load_after=loadavg())
    if m := re.search(r"stoker: run (LlamaPretrain/\d+)", out):
        r.run = m.group(1)
        train_ledger(r, env)
    if not ok:
        print(f"{mode}: the quickstart failed; the end of its output:\n{out[-3000:]}", file=sys.stderr)
    shutil.rmtree(home, ignore_errors=True)
    return r


def show(r: Result) -> str:
    share = f"{100 * r.startup_share:.0f} %" if r.startup_share is not None else "?"
    parts = ", ".join(f"{k} {v:.1f}s" for k, v in sorted(r.startup.items(), key=lambda kv: -kv[1]) if v >= 0.05)
    train = f"train step {r.train_s:.0f} s, {r.mean_step_s:.2f} s a step" if r.train_s and r.mean_step_s else "?"
    return (f"{r.mode:6} {'ok' if r.ok else 'FAILED':6} {r.wall_s:7.1f} s   {train}   start-up {share:>5} of its "
            f"node-time ({parts})   load {r.load_before} -> {r.load_after}")


def summary(results: list[Result], mode: str) -> tuple[float, float, float] | None:
    rows = [r for r in results if r.mode == mode and r.ok]
    if not rows:
        return None
    walls = [r.wall_s for r in rows]
    shares = [r.startup_share for r in rows if r.startup_share is not None]
    span = f"{min(walls):.1f} / {statistics.median(walls):.1f} / {max(walls):.1f} s"
    sh = f"{100 * min(shares):.0f} / {100 * statistics.median(shares):.0f} / {100 * max(shares):.0f} %" if shares \
        else "?"
    print(f"{mode:6} wall min/median/max {span}   start-up share min/median/max {sh}   ({len(rows)} runs)")
    return min(walls), statistics.median(walls), max(walls)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="runs of each mode (default 3)")
    ap.add_argument("--no-before", action="store_true", help="only the defaults, not STOKER_WARM_RANKS=0 too")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds one run may take")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    base = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH")) if p)}
    for k in ("STOKER_WARM_RANKS", "STOKER_PREFLIGHT_ALLREDUCE", "STOKER_PREFLIGHT", "STOKER_HOME"):
        base.pop(k, None)
    modes = ["now"] if a.no_before else ["now", "before"]
    first = loadavg()
    print(f"load average before: {first}  ({os.cpu_count()} cores)", flush=True)
    results: list[Result] = []
    for _ in range(a.runs):
        for mode in modes:
            results.append(one(mode, base, a.timeout))
            print(show(results[-1]), flush=True)
    print(f"load average before: {first}, after: {loadavg()}")
    spans = {m: summary(results, m) for m in modes}
    now, before = spans.get("now"), spans.get("before")
    if now and before:
        print(f"before / now: {before[1] / now[1]:.2f}x the median wall time")
    if now:
        shares = [r.startup_share for r in results if r.mode == "now" and r.startup_share is not None]
        print(f"goal: <= {GOAL_S:.0f} s on 2 quiet cores (median now {now[1]:.1f} s: "
              f"{'met' if now[1] <= GOAL_S else 'not met'}); start-up <= {100 * GOAL_STARTUP:.0f} % "
              f"({'met' if shares and max(shares) <= GOAL_STARTUP else 'not met'})")
    if a.json:
        print(json.dumps([asdict(r) for r in results], indent=1))
    return 0 if results and all(r.ok for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
