"""Goodput with injected faults: a local 2-node `@torchrun` gang (benchmarks/flows/goodput_bench_flow.py, the tiny
model, `stoker.train`, a checkpoint every 10 steps) run once per fault, and what stoker makes of each run.

    python benchmarks/goodput.py                       # runs none, kill, slow, config (~2-3 min on 2 cores)
    python benchmarks/goodput.py --faults kill,slow --steps 120 --json

The faults (one run each, `@retry(times=1)`):

    none    nothing: the baseline, and a gang whose ranks are equal names no straggler
    kill    attempt 0: node 1 SIGKILLs its own trainer a second after the first committed checkpoint; the retry
            resumes the gang from its last checkpoint
    slow    rank 1 sleeps 0.2 s more than rank 0 in every step (the straggler test hook STOKER_TEST_SLOW_RANK)
    config  a global batch that is no multiple of micro_batch_size x dp: a ConfigError, deterministic, not retried

Every rank's step is padded with a 20 ms sleep (`--pad`, the same hook): the tiny model's own ~5 ms step varies
between two ranks on a shared 2-core machine by more than the straggler threshold; a real step does not.

For each run it prints the ledger (`stoker goodput FLOW/RUN`: the categories, the checkpoint interval advice, per node
and attempt), each failed attempt's cause and evidence (`stoker show --json`: the manifests' `exception.cause` /
`evidence`, as the client's `Task.exception` has them), whether the run retried it, the stragglers the trainer
named, the straggler idle time in the ledger, and the ledger's own cost: the snapshots' `overhead_s` (the time the
trainer's ledger spent on the training thread: building snapshots, the immediate uploads after the loop's start and
each checkpoint) over the time of the steps. A summary table closes it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FLOW = ROOT / "benchmarks" / "flows" / "goodput_bench_flow.py"
FAULTS = ("none", "kill", "slow", "config")

try:  # run from a checkout without `pip install -e .`: use its src/
    import stoker  # noqa: F401
except ImportError:
    sys.path.insert(0, str(ROOT / "src"))


def tokens(path: Path) -> Path:
    """64 blocks of 33 tokens (uint16), as the tests' token files."""
    rng = np.random.default_rng(1)
    base = rng.integers(0, 256, size=97)
    np.concatenate([np.roll(base, i % 5) for i in range(22)]).astype(np.uint16).tofile(path)
    return path


def cli(env: dict[str, str], *args: str) -> str:
    return subprocess.run([sys.executable, "-m", "stoker.cli.main", *args], env=env, capture_output=True, text=True,
                          timeout=300, check=True).stdout


def run_one(fault: str, work: Path, data: Path, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """Run the flow with ``fault``; what its ledger, its show record and its output say."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, str(FLOW), "run", "--data", str(data), "--fault", fault, "--steps",
                        str(args.steps), "--pad", str(args.pad)], cwd=work, env=env, capture_output=True, text=True,
                       timeout=900)
    wall = time.perf_counter() - t0
    output = p.stdout + p.stderr
    m = re.search(r"run (GoodputBench/\d+)", output)
    if not m:
        raise SystemExit(f"--fault {fault}: no run in the output (exit {p.returncode}):\n{output[-3000:]}")
    pathspec = m.group(1)
    ledger_text = cli(env, "goodput", pathspec)
    ledger = json.loads(cli(env, "goodput", pathspec, "--json"))
    show = json.loads(cli(env, "show", pathspec, "--json"))
    return {"fault": fault, "pathspec": pathspec, "exit": p.returncode, "status": show["status"], "wall_s": wall,
            "ledger_text": ledger_text, "ledger": ledger, "show": show,
            "not_retried": [line.strip() for line in output.splitlines() if "not retried" in line][:1],
            "killed": [line.split("] ", 1)[-1] for line in output.splitlines() if "goodput_bench: killing" in line]}


def attribution(show: dict[str, Any]) -> list[dict[str, Any]]:
    """Each failed attempt of the run's tasks: step, task, attempt, cause, evidence."""
    out = []
    for step in show["steps"]:
        for task in step["tasks"]:
            failed = list(task.get("failed_attempts") or [])
            exc = task.get("exception")
            if exc and not task.get("successful") and not any(f["attempt"] == task["attempt"] for f in failed):
                failed.append({"attempt": task["attempt"], **exc})
            out += [{"step": step["name"], "task": task["id"], "attempt": f["attempt"], "cause": f.get("cause"),
                     "evidence": f.get("evidence") or f.get("message"), "retried": task["attempt"] > f["attempt"]}
                    for f in failed]
    return out


def stragglers(show: dict[str, Any]) -> list[str]:
    return [line for step in show["steps"] for task in step["tasks"] for line in task.get("stragglers") or []]


def ledger_cost(pathspec: str, ledger: dict[str, Any], home: str) -> dict[str, Any]:
    """The trainer ledgers' own time on the training thread (their snapshots' ``overhead_s``) against the time of
    the steps (``seconds.steps``), over every node and attempt of the training step."""
    os.environ["STOKER_HOME"] = home
    from stoker.client import Run
    from stoker.store.goodput import latest_snapshot

    run = Run(pathspec)
    overhead = steps_s = 0.0
    steps = snaps = 0
    for step in ledger["steps"]:
        for task in step["tasks"]:
            for a in task["attempts"]:
                snap = latest_snapshot(run._store, run.flow_name, run.id, step["step"], task["task_id"], a["attempt"])
                if snap is None:
                    continue
                snaps += 1
                overhead += float(snap.get("overhead_s") or 0.0)
                steps_s += float(snap["seconds"].get("steps", 0.0))
                steps += int(snap.get("step") or 0) - int(snap.get("start_step") or 0)
    return {"snapshots": snaps, "overhead_s": overhead, "steps_s": steps_s, "steps": steps,
            "share": overhead / steps_s if steps_s else None,
            "per_step_us": 1e6 * overhead / steps if steps else None}


def ledger_pieces(work: Path, n: int = 2000) -> dict[str, float]:
    """The ledger's two costs on the training thread, one by one, with its real series writer on a local store: a
    log window's snapshot (queued for the writer's thread) and the immediate upload after a committed checkpoint."""
    from stoker.train.ledger import Ledger, _open_writer

    writer = _open_writer(str(work / "pieces-store"), "runs/F/1/metrics/train/2/0/ledger/", 5.0)
    ledger = Ledger(lambda: writer)
    ledger.loop_started(0, 1024, 10)
    before = ledger.overhead_s
    for i in range(n):
        ledger.window(i)
    window_us = (ledger.overhead_s - before) / n * 1e6
    before = ledger.overhead_s
    for i in range(50):
        ledger.saved(10 * i)
    save_ms = (ledger.overhead_s - before) / 50 * 1e3
    ledger.close(n)
    return {"window_snapshot_us": window_us, "save_upload_ms": save_ms}


def report(r: dict[str, Any], home: str) -> dict[str, Any]:
    """Print one run's findings; the figures for the summary."""
    ledger, show = r["ledger"], r["show"]
    print(f"\n=== --fault {r['fault']}: {r['pathspec']} {r['status']} in {r['wall_s']:.1f} s (exit {r['exit']})")
    for line in r["killed"]:
        print(f"  injected: {line}")
    print("\n".join("  " + line for line in r["ledger_text"].rstrip().splitlines()))
    causes = attribution(show)
    print("  failed attempts (cause: evidence):" if causes else "  failed attempts: none")
    for c in causes:
        print(f"    {c['step']}/{c['task']} attempt {c['attempt']}: {c['cause']}: {c['evidence']}")
    for line in r["not_retried"]:
        print(f"  {line}")
    named = stragglers(show)
    print("  stragglers named:" if named else "  stragglers named: none")
    for line in named:
        print(f"    {line}")
    step = ledger["steps"][0] if ledger["steps"] else None
    idle = step["seconds"]["straggler_idle"] if step else None
    cost = ledger_cost(r["pathspec"], ledger, home)
    if step:
        productive = step["seconds"]["productive"]
        print(f"  straggler idle in the ledger: {idle:.2f} s of node-time ({100 * idle / (idle + productive):.1f} % of "
              "the steps' node-time)" if idle + productive else "")
    if cost["share"] is not None:
        print(f"  ledger cost: {cost['overhead_s'] * 1000:.1f} ms on the training thread over {cost['steps_s']:.2f} s "
              f"of steps ({cost['steps']} node-steps, {cost['snapshots']} node-attempts): {100 * cost['share']:.3f} % "
              f"of step time, {cost['per_step_us']:.0f} us per step")
    advice = step["checkpoint"]["advice"] if step else None
    return {"fault": r["fault"], "pathspec": r["pathspec"], "status": r["status"], "wall_s": round(r["wall_s"], 1),
            "failed_attempts": causes, "retried": all(c["retried"] for c in causes) if causes else None,
            "not_retried": r["not_retried"], "stragglers": named,
            "goodput": step["goodput"] if step else None, "straggler_idle_s": idle, "ledger_cost": cost,
            "advice": advice, "seconds": step["seconds"] if step else None}


def table(rows: list[dict[str, Any]]) -> None:
    print("\n| fault | run | goodput | failed attempts: cause | retried | straggler named | straggler idle | "
          "ledger cost (share of step time) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        causes = ", ".join(sorted({f"{c['cause']}" for c in r["failed_attempts"]})) or "-"
        n = len({(c["task"], c["attempt"]) for c in r["failed_attempts"]})
        retried = "-" if r["retried"] is None else ("yes" if r["retried"] else "no")
        named = "; ".join(s.split(" at ")[0].replace("straggler: ", "") for s in r["stragglers"]) or "nobody"
        cost = r["ledger_cost"]
        share = "-" if cost["share"] is None else f"{100 * cost['share']:.3f} % ({cost['per_step_us']:.0f} us/step)"
        good = "-" if r["goodput"] is None else f"{100 * r['goodput']:.1f} %"
        idle = "-" if r["straggler_idle_s"] is None else f"{r['straggler_idle_s']:.2f} s"
        print(f"| {r['fault']} | {r['status']} | {good} | {n}: {causes} | {retried} | {named} | {idle} | {share} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, of {', '.join(FAULTS)}")
    ap.add_argument("--steps", type=int, default=80, help="training steps per run")
    ap.add_argument("--pad", type=float, default=0.02, help="seconds every rank sleeps in each step (0: none)")
    ap.add_argument("--json", action="store_true", help="print the summary as one JSON object at the end")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (its STOKER_HOME has the runs)")
    args = ap.parse_args(argv)
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    if unknown := set(faults) - set(FAULTS):
        ap.error(f"unknown fault(s) {sorted(unknown)}: use {', '.join(FAULTS)}")
    work = Path(tempfile.mkdtemp(prefix="stoker-goodput-"))
    home = str(work / "home")
    env = {**os.environ, "STOKER_HOME": home, "STOKER_STORE": "", "STOKER_METRICS_INTERVAL": "0.5",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    env.pop("STOKER_MTBF_HOURS", None)
    rows = []
    try:
        data = tokens(work / "tokens.bin")
        for fault in faults:
            rows.append(report(run_one(fault, work, data, args, env), home))
        pieces = ledger_pieces(work)
    finally:
        if args.keep:
            print(f"\nwork folder kept: {work} (STOKER_HOME={home})")
        else:
            shutil.rmtree(work, ignore_errors=True)
    table(rows)
    print(f"\nledger, piece by piece: {pieces['window_snapshot_us']:.1f} us per log window's snapshot, "
          f"{pieces['save_upload_ms']:.2f} ms per upload after a committed checkpoint (local store)")
    if args.json:
        print(json.dumps({"steps": args.steps, "pad_s": args.pad, "runs": rows, "ledger_pieces": pieces}, indent=1,
                         default=str))
    bad = [r["fault"] for r in rows if (r["status"] == "failed") != (r["fault"] == "config")]
    if bad:
        print(f"unexpected outcome for --fault {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
