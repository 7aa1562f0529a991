"""Node-hours and an estimated cost of a run, for `stoker show` and the pipeline's summary.

Where the numbers come from (the store only, so it works for a run anywhere):
- a Batch job's JobRef (runs/FLOW/RUN/jobs/batch-ID.json): its instance type and, once known, the times Batch
  reports it started and stopped: node-hours = nodes x (stopped - started). Without those times, the manifests
  of its tasks (one per node) are summed instead;
- a Slurm job's tasks: the sum of their manifests' durations (one task a node, or an array element); not
  priced (a cluster's own cost is not on a price list);
- tasks with no job record ran here (the local backend): the time this machine was busy with them, not priced.

Prices are the on-demand table of instances.py (`$STOKER_PRICES` overrides it). The estimate counts the time a
job ran, not instance start-up, idle time before Batch scales a compute environment down, storage or data
transfer: the bill is higher.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from stoker.backends.aws.instances import price_per_hour
from stoker.runtime.contract import JobRef
from stoker.runtime.driver.jobs import jobs_prefix
from stoker.store.blobs import BlobStore
from stoker.store.manifest import run_prefix

PRICES_HINT = "add it to $STOKER_PRICES (a TOML file of \"type\" = dollars_per_hour)"


@dataclass
class StepCost:
    """One line of the summary: the jobs of one step on one backend and instance type."""

    step: str
    backend: str  # "batch", "slurm", "local", ...
    instance_type: str | None = None
    nodes: int = 1  # nodes of the largest job (a gang's size)
    jobs: int = 0  # submissions (retries included)
    node_hours: float = 0.0
    price: float | None = None  # USD per node-hour
    running: bool = False  # a job had not stopped yet: its hours so far

    @property
    def cost(self) -> float | None:
        return None if self.price is None else self.node_hours * self.price


@dataclass
class CostSummary:
    flow: str
    run_id: str
    rows: list[StepCost] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def node_hours(self) -> float:
        return sum(r.node_hours for r in self.rows)

    @property
    def cost(self) -> float | None:
        """The estimated cost of the priced rows (None when no row is priced)."""
        priced = [r.cost for r in self.rows if r.cost is not None]
        return sum(priced) if priced else None

    @property
    def unpriced_cloud(self) -> list[StepCost]:
        """Batch rows with no price: the estimate leaves them out."""
        return [r for r in self.rows if r.backend == "batch" and r.price is None]

    @property
    def worth_showing(self) -> bool:
        """Something ran off this machine (a local-only run has nothing to bill)."""
        return any(r.backend != "local" for r in self.rows)

    def headline(self) -> str:
        """One line: node-hours and the estimate, e.g. `2.03 node-hours, estimated $43.00 (on-demand prices)`."""
        text = f"{self.node_hours:.2f} node-hours"
        if self.cost is not None:
            text += f", estimated ${self.cost:,.2f} (on-demand prices"
            missing = self.unpriced_cloud
            if missing:
                text += f"; without {sum(r.node_hours for r in missing):.2f} unpriced node-hours"
            text += ")"
        elif self.unpriced_cloud:
            text += ", cost not estimated (no price for the instance types used)"
        else:
            where = sorted({r.backend for r in self.rows}) or ["local"]
            text += f" ({', '.join(where)}: cost not estimated)"
        return text

    def lines(self) -> list[str]:
        """The headline, a line per step and backend, and the notes (for `stoker show`)."""
        out = [f"cost: {self.headline()}"]
        width = max((len(r.step) for r in self.rows), default=4)
        for r in self.rows:
            if r.backend == "local":
                what = f"this machine, {r.jobs} task{'s' if r.jobs != 1 else ''}"
            else:
                what = f"{r.nodes} x {r.instance_type}" if r.instance_type else \
                    f"{r.nodes} node{'s' if r.nodes != 1 else ''}"
                what += f", {r.jobs} jobs" if r.jobs > 1 else ""
            cost = f" x ${r.price:,.2f}/h = ${r.cost:,.2f}" if r.price is not None and r.cost is not None else \
                ", not priced"
            live = " (still running)" if r.running else ""
            out.append(f"  {r.step:<{width}}  {r.backend:<6} {what}: {r.node_hours:.2f} node-hours{cost}{live}")
        out += [f"  note: {n}" for n in self.notes]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"flow": self.flow, "run_id": self.run_id, "node_hours": round(self.node_hours, 4),
                "cost_usd": None if self.cost is None else round(self.cost, 2),
                "steps": [{**asdict(r), "cost": r.cost} for r in self.rows], "notes": list(self.notes)}


def _manifests(store: BlobStore, flow: str, run_id: str) -> dict[tuple[str, str, int], dict[str, Any]]:
    """(step, task_id, attempt) -> manifest, for the tasks that ran in this run (not those cloned by resume)."""
    out = {}
    for name in store.list(run_prefix(flow, run_id)):
        if not name.endswith("/manifest.json"):
            continue
        try:
            m = json.loads(store.read(name))
        except (ValueError, OSError):
            continue
        if m.get("origin_task"):  # cloned from the run it resumes: it cost nothing here
            continue
        out[(str(m.get("step")), str(m.get("task_id")), int(m.get("attempt", 0)))] = m
    return out


def _seconds(m: dict[str, Any]) -> float:
    start, end = m.get("started_at"), m.get("finished_at")
    return max(0.0, float(end) - float(start)) if start is not None and end is not None else 0.0


def _busy_hours(intervals: list[tuple[float, float]]) -> float:
    """Hours covered by the union of intervals (tasks running side by side here share one machine)."""
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total / 3600.0


def job_hours(ref: JobRef, manifests: dict[tuple[str, str, int], dict[str, Any]], now: float
              ) -> tuple[float, bool]:
    """(node-hours, still running?) of one job: Batch's start and stop times, else its tasks' manifests, else
    (a Batch job that started and has no manifest yet) the time since it started."""
    started, stopped = ref.extra.get("started_at"), ref.extra.get("stopped_at")
    if ref.backend == "batch" and started is not None and stopped is not None:
        return ref.members * max(0.0, float(stopped) - float(started)) / 3600.0, False
    mine = [manifests[k] for k in ((ref.step, t, ref.attempt) for t in ref.task_ids) if k in manifests]
    if mine:
        return sum(_seconds(m) for m in mine) / 3600.0, False
    if ref.backend == "batch" and started is not None:
        return ref.members * max(0.0, now - float(started)) / 3600.0, True
    return 0.0, False


def run_cost(store: BlobStore, flow: str, run_id: str, now: float | None = None) -> CostSummary:
    """Node-hours and estimated cost of the run `flow/run_id`, per step and backend (see the module doc)."""
    now = time.time() if now is None else now
    summary = CostSummary(flow=flow, run_id=run_id)
    manifests = _manifests(store, flow, run_id)
    refs: list[JobRef] = []
    for name in store.list(jobs_prefix(flow, run_id)):
        if name.endswith(".json"):
            try:
                refs.append(JobRef.from_json(store.read(name)))
            except (ValueError, TypeError):
                summary.notes.append(f"unreadable job record {name}: left out")
    covered: set[tuple[str, str, int]] = set()
    rows: dict[tuple[str, str, str | None], StepCost] = {}
    no_times = []
    for ref in sorted(refs, key=lambda r: (r.submitted_at, r.job_id)):
        covered |= {(ref.step, t, ref.attempt) for t in ref.task_ids}
        itype = ref.extra.get("instance_type") or None
        hours, running = job_hours(ref, manifests, now)
        if hours == 0.0 and ref.backend == "batch" and ref.extra.get("started_at") is None:
            no_times.append(ref.job_id)
        row = rows.setdefault((ref.step, ref.backend, itype), StepCost(
            step=ref.step, backend=ref.backend, instance_type=itype, nodes=0,
            price=price_per_hour(itype) if itype and ref.backend == "batch" else None))
        row.nodes = max(row.nodes, ref.members)
        row.jobs += 1
        row.node_hours += hours
        row.running = row.running or running
    local = [(k, m) for k, m in manifests.items() if k not in covered]
    if local:
        steps = sorted({k[0] for k, _ in local})
        hours = _busy_hours([(float(m["started_at"]), float(m["finished_at"])) for _, m in local
                             if m.get("started_at") is not None and m.get("finished_at") is not None])
        rows[(", ".join(steps), "local", None)] = StepCost(step=", ".join(steps), backend="local", nodes=1,
                                                           jobs=len(local), node_hours=hours)
    summary.rows = list(rows.values())
    for r in summary.rows:
        if r.backend == "batch" and not r.instance_type:
            summary.notes.append(f"step {r.step}: the Batch job did not record its instance type, so it is not "
                                 f"priced: set @batch(instance_type=...) (e.g. trn1.32xlarge)")
        elif r.backend == "batch" and r.price is None:
            summary.notes.append(f"no price for {r.instance_type}: {PRICES_HINT}")
    if no_times:
        summary.notes.append(f"Batch jobs {', '.join(no_times)} have no start time yet: counted as 0 node-hours")
    others = sorted({r.backend for r in summary.rows if r.backend not in ("batch", "local")})
    if others:
        summary.notes.append(f"{', '.join(others)} steps are not priced (a cluster's own cost has no list price)")
    return summary


def cost_headline(store_url: str, flow: str, run_id: str) -> str:
    """`run_cost(...).headline()` for a summary that must not fail: the reason instead when it cannot tell."""
    from stoker.errors import StokerError
    from stoker.store.blobs import open_store

    try:
        return run_cost(open_store(store_url), flow, run_id).headline()
    except (StokerError, OSError) as e:
        return f"not available ({e})"
