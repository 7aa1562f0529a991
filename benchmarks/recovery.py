"""Recovery from a lost node: a hot spare (`@torchrun(spares=1)`) against today's whole-gang retry, side by side.

    python benchmarks/recovery.py                          # local, and Slurm when its daemons can run (~5 min)
    python benchmarks/recovery.py --backend slurm --queue-wait 0,60
    python benchmarks/recovery.py --backend local --json

The same flow (tests/flows/spares_flow.py: a 2-node `@torchrun` gang training the tiny model with `stoker.train`, a
checkpoint every 4 steps, `@retry(times=1)`) runs twice per backend and queue wait: with one spare, and with none
(`SPARES_FLOW_SPARES=0`, what every orchestrator does today: the gang fails, is resubmitted, starts again and
resumes from its checkpoint). In each run, once a checkpoint past step 12 is committed and two more steps are
logged, node 1 is lost:
- local: its member process and everything under it get SIGKILL at once (as a host that dies ends them);
- Slurm (the localhost cluster of tests/slurm_cluster.py, 3 nodes, or SLURM_CONF's): its slurmd, step daemons and
  job processes get SIGKILL (`SlurmCluster.kill_node`); the node is revived after the run.
Recovery = the loss to the first training step after it: the first record rank 0 appends to metrics.jsonl (its
`time`, written by the trainer itself; all nodes share this host's clock) after the kill for a step that had been
logged before it (the restarted training redoes the steps since its checkpoint).

Queue wait (Slurm only, `--queue-wait W`): right after the kill the partition is set DOWN for W seconds (`scontrol
update PartitionName=debug State=DOWN`: jobs are queued, nothing new is allocated, running jobs go on), as a busy
queue would hold a new job. A gang with a spare keeps its allocation and never notices; the whole-gang retry waits in
the queue. The ratio grows with W.

Goal (issue 26): the spare recovers at least 5x faster on the local Slurm cluster. The exit status is non-zero when
a run fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "src"
sys.path.insert(0, str(REPO))  # the flow and its helpers are the hot-spare tests' (tests/spares_support.py)
from tests.spares_support import FLOW, committed, kill_tree, slurm_node_of, spares_run, tokens  # noqa: E402

STEPS = 80
GOAL = 5.0


@dataclass
class Result:
    backend: str
    queue_wait_s: float
    how: str  # "spare" or "retry"
    recovery_s: float | None
    wall_s: float
    ok: bool
    note: str = ""
    decided_s: float | None = None  # the kill to the driver's decision: a spare posted, or the gang's retry


def logged(metrics: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def first_step_after(metrics: Path, t: float) -> float | None:
    """When the first step of the restarted training was logged: the first record after `t` whose step was already
    logged before it (training resumed from a checkpoint behind the kill; a step that was in flight at the kill
    and logged just after it is not the restart)."""
    records = logged(metrics)
    before = max((int(r["step"]) for r in records if float(r.get("time", 0)) <= t), default=0)
    return next((float(r["time"]) for r in records if float(r.get("time", 0)) > t and int(r["step"]) <= before), None)


def partition_state(cluster: Any, state: str) -> None:
    """DOWN: the partition queues jobs but allocates nothing (running jobs go on); UP again."""
    subprocess.run(["scontrol", "update", f"PartitionName={cluster.partition}", f"State={state}"],
                   env={**os.environ, **cluster.env}, check=True, capture_output=True)


def one(root: Path, backend: str, how: str, wait: float, cluster: object | None, base_env: dict[str, str]) -> Result:
    """One run: start the flow, lose node 1 after a checkpoint past step 12, measure the recovery."""
    folder = Path(tempfile.mkdtemp(prefix=f"{backend}-{how}-", dir=root))
    ckpt, out = folder / "ckpt", folder / "out"
    env = {**base_env, "STOKER_HOME": str(folder / "home"), "SPARES_FLOW_SPARES": "1" if how == "spare" else "0",
           "STOKER_STORE": "", "STOKER_SHARED_PATHS": f"{root}:{FLOW.parent}"}
    extra = ["--out", str(out), *(["--backend", "slurm=train"] if backend == "slurm" else [])]
    t0 = time.time()
    run = spares_run(folder, root / "tokens.bin", ckpt, *extra, steps=STEPS, env=env)
    proc = run.proc
    blocker, node, killed = None, None, 0.0
    try:
        pid = int(run.wait_for(r"spares_flow: node 1 member \S+ pid (\d+) attempt 0").group(1))
        deadline = time.time() + 300
        # a checkpoint past step 12, and two steps past it: the restart redoes steps already logged
        while time.time() < deadline and proc.poll() is None and not (
                (c := committed(ckpt)) >= 12 and max((int(r["step"]) for r in logged(out / "metrics.jsonl")),
                                                     default=0) >= c + 2):
            time.sleep(0.02)
        if backend == "slurm":
            job = run.wait_for(r"submitted to slurm as job (\d+)").group(1)
            node = slurm_node_of(job, 1 if how == "retry" else int(
                run.wait_for(r"spares_flow: node 1 member (\d+)").group(1)))
            killed = time.time()
            cluster.kill_node(node)  # type: ignore[attr-defined]
            if wait > 0:  # the partition takes no new allocation for `wait` seconds: a busy queue
                blocker = threading.Timer(wait, partition_state, args=(cluster, "UP"))
                partition_state(cluster, "DOWN")
                blocker.start()
        else:
            killed = time.time()
            kill_tree(pid)
        code = proc.wait(timeout=600 + wait)
    except Exception:
        print(run.text[-6000:], file=sys.stderr)
        raise
    finally:
        if proc.poll() is None:
            proc.kill()
        run.thread.join(timeout=5)
        if blocker:
            blocker.cancel()
            partition_state(cluster, "UP")
        if node:
            cluster.revive_node(node)  # type: ignore[attr-defined]
    first = first_step_after(out / "metrics.jsonl", killed)
    decided = run.first("takes its place" if how == "spare" else "retry 1 of", killed)
    text = run.text
    note = "the spare took its place" if "takes its place" in text else "whole-gang retry" if "retry 1 of" in text \
        else "?"
    if code != 0:
        print(text[-4000:], file=sys.stderr)
    return Result(backend, wait, how, None if first is None else first - killed, time.time() - t0, code == 0, note,
                  None if decided is None else decided - killed)


@contextlib.contextmanager
def slurm(root: Path) -> Iterator[object]:
    sys.path.insert(0, str(REPO / "tests"))
    from slurm_cluster import SlurmCluster, available

    if reason := available():
        raise RuntimeError(reason)
    with SlurmCluster(root / "cluster", nodes=3) as cluster:
        yield cluster


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=["local", "slurm", "all"], default="all")
    ap.add_argument("--queue-wait", default="0", help="Slurm: seconds of simulated queue wait, comma-separated")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    waits = [float(w) for w in a.queue_wait.split(",")]
    root = Path(tempfile.mkdtemp(prefix="stoker-recovery-"))
    tokens(root)
    base = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1"}
    results: list[Result] = []
    if a.backend in ("local", "all"):
        for how in ("spare", "retry"):
            results.append(one(root, "local", how, 0.0, None, base))
            print(asdict(results[-1]), flush=True)
    if a.backend in ("slurm", "all"):
        try:
            with slurm(root) as cluster:
                env = {**base, **cluster.env}  # type: ignore[attr-defined]
                for wait in waits:
                    for how in ("spare", "retry"):
                        results.append(one(root, "slurm", how, wait, cluster, env))
                        print(asdict(results[-1]), flush=True)
        except RuntimeError as e:
            print(f"Slurm rows skipped: {e}", file=sys.stderr)
    if a.json:
        print(json.dumps([asdict(r) for r in results], indent=1))
    print(f"\n{'backend':8} {'queue wait':>10} {'spare':>9} {'retry':>9} {'ratio':>7}  goal  "
          f"(the kill to the driver's decision: spare / retry)")
    for backend in ("local", "slurm"):
        for wait in sorted({r.queue_wait_s for r in results if r.backend == backend}):
            by = {r.how: r for r in results if r.backend == backend and r.queue_wait_s == wait}
            s, r = by.get("spare"), by.get("retry")
            if not s or not r or s.recovery_s is None or r.recovery_s is None:
                print(f"{backend:8} {wait:>9.0f}s  (a run failed: see above)")
                continue
            ratio = r.recovery_s / s.recovery_s
            goal = f">= {GOAL:.0f}x {'met' if ratio >= GOAL else 'NOT met'}" if backend == "slurm" else ""
            dec = "/".join("?" if x.decided_s is None else f"{x.decided_s:.1f}s" for x in (s, r))
            print(f"{backend:8} {wait:>9.0f}s {s.recovery_s:>8.1f}s {r.recovery_s:>8.1f}s {ratio:>6.1f}x  {goal}  "
                  f"({dec})")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
