"""The goodput ledger of a run: where the wall time of every training step went, per attempt and per node, from what
the run recorded in the store (timestamps, not guesses), so it reads the same for a run here, on Slurm or on Batch.

Sources, all in the run's folder of the store:
- the job records the scheduler keeps (``jobs/<backend>-<id>.json``, runtime/driver/jobs.py): when each unit was
  submitted and, on Batch, when the engine started it, and the instance type;
- the attempts' manifests: ``started_at`` (the task started), ``finished_at``, ``status``, and ``timings``, the
  start-up phases the node and the task timed (stoker.store.goodput.PHASES);
- the trainer's ledger (stoker.train.ledger): a cumulative snapshot per log window from local rank 0 of every node.

A training step is a step whose tasks wrote a trainer ledger. Each of its tasks is a node; each node's time from
its first submission to its last attempt's end is split into :data:`CATEGORIES`, which add up to it exactly
(``other`` takes what no record explains; none is ever negative: where records overlap, clocks of different hosts or a
phase timed twice, the overlap comes out of the queue and start-up first, :func:`_settle`).

A gang with hot spares (``@torchrun(spares=k)``, stoker.client.gangs) keeps its attempt through a node loss: each
new generation restarts the trainer of every node, so one attempt's ledger holds several trainers' snapshots. Its
time is split per generation (:func:`_generations`): from each loss to the next generation's first training step
is ``recovery`` (for every node: the survivors wait too), the steps a generation did past the checkpoint the next
one resumed from and the time from its trainer's last snapshot to the loss are ``lost``; a slot a spare took counts
from the gang's start (the lost member's time, then the spare's), and its queue is the gang's, never the time to the
take-over. :func:`run_goodput`
returns one JSON-able dict (docs/operations.md, "Where the time went: goodput", lists its keys).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

from stoker.client.gangs import step_gangs
from stoker.store.blobs import BlobStore
from stoker.store.checkpoint_advice import NODE_MTBF_HOURS, NOT_FAILURES, advise, env_mtbf_hours, job_mtbf
from stoker.store.goodput import LEDGER_SERIES, PHASES, latest_snapshot, ledger_segments
from stoker.store.manifest import read_manifest_object, run_prefix

VERSION = 1
# in the order a stacked bar draws them: the wait before an attempt, its start, its work, its end
CATEGORIES = ("retry_wait", "queue", "startup", "checkpoint_load", "productive", "straggler_idle", "eval",
              "checkpoint_save", "lost", "hang", "recovery", "shutdown", "other")
_HANG = re.compile(r"no progress for (\d+(?:\.\d+)?) s")
PAID_EXCLUDES = ("retry_wait", "queue")  # no node is held then
JOBS = "jobs/"  # the scheduler's job records under the run's prefix (runtime/driver/jobs.py: jobs_prefix)
Price = Callable[[str], "float | None"]  # instance type -> USD per node-hour (backends/aws/instances.price_per_hour)
# the categories' names as `stoker goodput` and the UI show them
LABELS = {"retry_wait": "retry wait", "queue": "queue", "startup": "start-up", "checkpoint_load": "checkpoint load",
          "productive": "productive", "straggler_idle": "straggler idle", "eval": "evaluation",
          "checkpoint_save": "checkpoint save", "lost": "lost work", "hang": "hang (no progress)",
          "recovery": "recovery", "shutdown": "shutdown", "other": "other"}


def _listing(store: BlobStore, flow: str, run_id: str) -> tuple[list[str], list[str], set[tuple[str, str, int]]]:
    """(manifest names, job record names, (step, task, attempt) of every trainer ledger) of the run."""
    base = run_prefix(flow, run_id)
    manifests, jobs, ledgers = [], [], set()
    for name in store.list(base):
        rest = name[len(base):]
        if rest.endswith("/manifest.json"):
            manifests.append(name)
        elif rest.startswith(JOBS) and rest.endswith(".json"):
            jobs.append(name)
        elif rest.startswith("metrics/") and f"/{LEDGER_SERIES}" in rest:
            parts = rest.split("/")
            if len(parts) >= 6 and parts[3].isdigit():
                ledgers.add((parts[1], parts[2], int(parts[3])))
    return manifests, jobs, ledgers


def _read_inputs(store: BlobStore, flow: str, run_id: str, notes: list[str]
                 ) -> tuple[dict[tuple[str, str, int], dict], dict[tuple[str, str, int], dict], set]:
    manifest_names, job_names, ledgers = _listing(store, flow, run_id)
    steps = {s for s, _, _ in ledgers}
    manifests: dict[tuple[str, str, int], dict] = {}
    for name in manifest_names:
        if name[len(run_prefix(flow, run_id)):].split("/", 1)[0] not in steps:
            continue
        try:
            m = read_manifest_object(store, name)
        except Exception as e:  # noqa: BLE001 - its times still count (nothing is loaded or run from it), said so
            try:
                m = json.loads(store.read(name))
                notes.append(f"{name}: its signature could not be checked ({type(e).__name__}); its times are used")
            except (ValueError, OSError) as e2:
                notes.append(f"{name}: not read ({e2})")
                continue
        if not m.get("origin_task"):  # a task cloned by resume cost nothing in this run
            manifests[(str(m["step"]), str(m["task_id"]), int(m["attempt"]))] = m
    jobs: dict[tuple[str, str, int], dict] = {}
    for name in job_names:
        try:
            ref = json.loads(store.read(name))
        except (ValueError, OSError) as e:
            notes.append(f"{name}: not read ({e})")
            continue
        if ref.get("step") in steps:
            for i, task in enumerate(ref.get("task_ids") or []):
                jobs[(str(ref["step"]), str(task), int(ref.get("attempt", 0)))] = {**ref, "member": i}
    return manifests, jobs, ledgers


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _phases(timings: dict[str, float] | None) -> dict[str, dict[str, float]]:
    """The manifest's timings by where they sit: node / start / end (an unknown phase is a start-up one)."""
    out: dict[str, dict[str, float]] = {"node": {}, "start": {}, "end": {}}
    for name, secs in (timings or {}).items():
        if _num(secs) is not None:
            out[PHASES.get(name, "start")][name] = float(secs)
    return out


def _steps_split(snap: dict, status: str, kept_at: int | None, tail: float) -> tuple[float, float, float, dict]:
    """(productive, lost, what is left of the tail, steps) of one attempt's loop time. A failed attempt keeps the
    steps up to the checkpoint the next attempt resumed from (else its own last committed one); the rest is lost
    work, timed at the attempt's mean step time; after its last snapshot (a killed trainer) the time to its end is
    lost too, but for the steps kept beyond that snapshot."""
    steps_s = float(snap["seconds"].get("steps", 0.0))
    s0, last = int(snap.get("start_step") or 0), int(snap.get("step") or 0)
    n = last - s0
    mean = steps_s / n if n > 0 else None
    info = {"first": s0, "last": last, "mean_step_s": mean}
    if status == "running":  # every step so far is kept, and the time since the last snapshot is steps too
        return steps_s + tail, 0.0, 0.0, {**info, "kept": last, "lost": 0}
    if status != "failed":
        return steps_s, 0.0, tail, {**info, "kept": last, "lost": 0}
    committed = snap.get("committed_step")
    keep = kept_at if kept_at is not None else (int(committed) if committed is not None else s0)
    keep = max(keep, s0)
    productive = (min(keep, last) - s0) * mean if mean else 0.0
    lost = steps_s - productive
    if not snap.get("final"):  # killed: from its last snapshot to its end nothing was kept but checkpointed steps
        extra = min(tail, (keep - last) * mean) if mean and keep > last else 0.0
        productive, lost, tail = productive + extra, lost + tail - extra, 0.0
    return productive, lost, tail, {**info, "kept": keep, "lost": max(0, last - keep)}


def _before_start(st: float, job: dict | None, phases: dict[str, dict[str, float]]
                  ) -> tuple[float, float, dict[str, float]]:
    """(begin, queue, start-up before the task: the engine's environment and the node phases) of a task started at
    ``st``: queued from the job's submission to the engine's start of it, then the node's agent set up."""
    t_node = st - sum(phases["node"].values())  # when the node's agent started (a remote node's)
    sub = _num((job or {}).get("submitted_at"))
    begin = min(sub, t_node) if sub is not None else t_node
    engine = _num(((job or {}).get("extra") or {}).get("started_at"))
    engine = min(max(engine, begin), t_node) if engine is not None else t_node
    return begin, engine - begin, {"environment": t_node - engine, **phases["node"]}


def _attempt(key: tuple[str, str, int], manifest: dict | None, job: dict | None, snap: dict | None,
             kept_at: int | None, now: float) -> dict[str, Any] | None:
    """One attempt of one node: its span and its seconds by category (without the retry wait before it)."""
    m = manifest or {}
    status = str(m.get("status") or "running")
    st, fin = _num(m.get("started_at")), _num(m.get("finished_at"))
    if st is None:  # no manifest yet: a running attempt, as far as its records go
        st = _num((snap or {}).get("process_started_at")) or _num((snap or {}).get("created_at"))
        st = st if st is not None else _num((job or {}).get("submitted_at"))
        fin = now
    if st is None or fin is None:
        return None
    phases = _phases(m.get("timings"))
    begin, queue, startup = _before_start(st, job, phases)
    sec = dict.fromkeys(CATEGORIES, 0.0)
    sec["queue"] = queue
    steps: dict[str, Any] = {}
    end_at = max(fin, st)
    if snap is not None:
        created = float(snap["created_at"])
        proc = _num(snap.get("process_started_at"))
        proc = min(max(proc, st), created) if proc is not None else created
        startup.update(phases["start"])
        startup["imports"] = created - proc  # the trainer process's Python and torch imports
        startup["launch"] = max(0.0, proc - st - sum(phases["start"].values()))  # task and torchrun start
        startup["trainer_init"] = float(snap["seconds"].get("init", 0.0))
        tail = max(0.0, end_at - max(float(snap["time"]), created))
        for cat, act in (("checkpoint_load", "checkpoint_load"), ("checkpoint_save", "checkpoint_save"),
                         ("eval", "eval")):
            sec[cat] = float(snap["seconds"].get(act, 0.0))
        sec["productive"], sec["lost"], tail, steps = _steps_split(snap, status, kept_at, tail)
        idle = min(_num(snap.get("straggler_idle_s")) or 0.0, sec["productive"])
        sec["productive"], sec["straggler_idle"] = sec["productive"] - idle, idle
        sec["shutdown"] = tail
        in_task = (min(created, end_at) - st) + startup["trainer_init"]
        sec["startup"] = sum(v for k, v in startup.items() if k in ("environment", *phases["node"])) + in_task
    else:  # the trainer never wrote a snapshot: the attempt did not get to train (or ran no stoker.train)
        startup.update(phases["start"])
        rest = end_at - st - sum(phases["end"].values())
        startup["launch"] = max(0.0, rest - sum(phases["start"].values()))
        sec["startup"] = startup["environment"] + sum(phases["node"].values()) + max(0.0, rest)
        sec["shutdown"] = min(sum(phases["end"].values()), end_at - st)
    _book_hang(sec, m)
    wall = end_at - begin
    overlap = _settle(sec, wall)
    snap = snap or {}
    return {"task_id": key[1], "attempt": key[2], "status": status, "begin": begin, "started_at": st, "end": end_at,
            "wall_s": wall, "seconds": sec, "startup": {k: v for k, v in startup.items() if v}, "steps": steps,
            "tokens_per_step": int(snap.get("tokens_per_step") or 0), "saves": int(snap.get("saves") or 0),
            "checkpoint_every": snap.get("checkpoint_every") or None,
            "checkpoint_policy": snap.get("checkpoint_policy") or None,
            "cause": (m.get("exception") or {}).get("cause") if status == "failed" else None,
            "instance_type": ((job or {}).get("extra") or {}).get("instance_type"),
            "backend": (job or {}).get("backend") or "local", "measured": bool(snap), "overlap_s": overlap}


# a deficit (records that overlap: clocks of different hosts) is taken from these first; none of them changes goodput
# but the unpaid waits, and taking those out of the unpaid time only lowers it
_OVERLAP_FROM = ("queue", "retry_wait", "startup", "shutdown", "recovery", "hang", "straggler_idle", "eval",
                 "checkpoint_save", "checkpoint_load", "lost", "productive")


def _settle(sec: dict[str, float], wall: float) -> float:
    """Book what no record explains as ``other`` so the categories add up to ``wall``, none negative (a negative
    measure is clamped to 0): where the records overlap (they add up to more than ``wall``), the overlap is taken out
    of the categories in :data:`_OVERLAP_FROM`'s order. Returns that overlap (seconds counted twice)."""
    for k in sec:
        sec[k] = max(0.0, sec[k])
    other = wall - sum(v for k, v in sec.items() if k != "other")
    overlap = max(0.0, -other)
    need = overlap
    for k in _OVERLAP_FROM:
        take = min(need, sec[k])
        sec[k], need = sec[k] - take, need - take
    sec["other"] = other if other > 1e-9 else 0.0  # never -0.0 nor a rounding error's negative
    return overlap


def _book_hang(sec: dict[str, float], m: dict) -> None:
    """An attempt stopped as hung (cause `hang`, runtime/member/watchdog.py): its silence before the stop, which its
    TaskHang message states, is `hang`, taken from where the records put it (the time after the trainer's last
    snapshot, else the start-up that never ended), in place."""
    exc = m.get("exception") or {}
    found = _HANG.search(str(exc.get("message") or "")) if exc.get("cause") == "hang" else None
    idle = float(found.group(1)) if found else 0.0
    for k in ("shutdown", "lost", "startup", "productive"):
        take = min(idle, sec[k])
        sec[k], sec["hang"], idle = sec[k] - take, sec["hang"] + take, idle - take


def _generations(row: dict[str, Any], manifest: dict, segs: list[dict], gang: dict, gang_start: float | None,
                 kept_at: int | None, job: dict | None = None) -> None:
    """Re-split one node's attempt of a gang that moved through generations (see the module docstring) in place:
    ``segs`` are its trainers' last snapshots, oldest first; the last one is what :func:`_attempt` accounted."""
    losses = sorted((float(g["lost"]["at"]), g["started_at"]) for g in gang["generations"][1:]
                    if isinstance(g.get("lost"), dict) and _num(g["lost"].get("at")) is not None)
    st, end, sec = row["started_at"], row["end"], row["seconds"]
    losses = [(at, first) for at, first in losses if at < end]
    if not losses or not segs:
        return
    t0 = gang_start if gang_start is not None and st > losses[0][0] else st  # a slot a spare took: the gang's start
    t0 = min(t0, st)
    phases = _phases(manifest.get("timings"))
    # what came before the task: for a slot a spare took, before the gang's start (the spare's task started later,
    # it never queued then); the queue is only the gang's wait, never the lost member's or the spare's time
    begin, sec["queue"], startup = _before_start(t0, job, phases)
    startup.update(phases["start"])
    for k in ("checkpoint_load", "checkpoint_save", "eval", "productive", "straggler_idle", "lost", "shutdown",
              "hang", "recovery"):
        sec[k] = 0.0
    sec["startup"] = startup["environment"] + sum(phases["node"].values())
    info: dict[str, Any] = {}
    steps_s = n_steps = saves = 0
    for i, snap in enumerate(segs):
        created, seconds = float(snap["created_at"]), snap["seconds"]
        before = [(at, first) for at, first in losses if at <= created]  # the loss this trainer came after
        after = [at for at, _ in losses if at > created]  # the loss that ended it
        steps = float(seconds.get("steps", 0.0))
        if before:
            first = before[-1][1]
            if first is None:  # its generation never did a step: all of it lies in the recovery
                continue
            loop = _num(snap.get("loop_started_at"))
            steps -= min(steps, max(0.0, first - loop)) if loop is not None else 0.0  # its first step: recovery
        else:  # the attempt's first trainer: its start is start-up, its load a checkpoint load
            proc = _num(snap.get("process_started_at"))
            proc = min(max(proc, t0), created) if proc is not None else created
            startup["imports"] = created - proc
            startup["launch"] = max(0.0, proc - t0 - sum(phases["start"].values()))
            startup["trainer_init"] = float(seconds.get("init", 0.0))
            sec["startup"] += (created - t0) + startup["trainer_init"]
            sec["checkpoint_load"] += float(seconds.get("checkpoint_load", 0.0))
        if after:  # ended by a loss: what it did past the checkpoint the next generation resumed from is lost
            steps -= min(steps, max(0.0, float(snap["time"]) - after[0]))  # it ran on past the loss: recovery
            nxt = next((int(n["start_step"]) for n in segs[i + 1:] if n.get("start_step") is not None), None)
            status, kept, tail = "failed", nxt, max(0.0, after[0] - float(snap["time"]))
        else:
            status, kept, tail = row["status"], kept_at, max(0.0, end - max(float(snap["time"]), created))
        p, lost, tail, part = _steps_split({**snap, "seconds": {**seconds, "steps": steps}, "final": True}
                                           if after else {**snap, "seconds": {**seconds, "steps": steps}},
                                           status, kept, tail)
        idle = min(_num(snap.get("straggler_idle_s")) or 0.0, p)
        sec["productive"] += p - idle
        sec["straggler_idle"] += idle
        sec["lost"] += lost + (tail if after else 0.0)
        if not after:
            sec["shutdown"] += tail
        sec["checkpoint_save"] += float(seconds.get("checkpoint_save", 0.0))
        sec["eval"] += float(seconds.get("eval", 0.0))
        saves += int(snap.get("saves") or 0)
        steps_s += float(seconds.get("steps", 0.0))
        n_steps += part["last"] - part["first"]
        info = {"first": info.get("first", part["first"]), "last": part["last"], "kept": part["kept"],
                "lost": info.get("lost", 0) + part["lost"]}
    bounds = [at for at, _ in losses] + [end]
    sec["recovery"] = sum(max(0.0, min(first if first is not None else bounds[j + 1], bounds[j + 1], end) - at)
                          for j, (at, first) in enumerate(losses))
    row["begin"] = begin
    row["wall_s"] = end - begin
    _book_hang(sec, manifest)
    row["overlap_s"] = _settle(sec, row["wall_s"])
    row["startup"] = {k: v for k, v in startup.items() if v}
    row["saves"] = saves
    if info:
        row["steps"] = {**info, "mean_step_s": steps_s / n_steps if n_steps > 0 else None}
    row["generations"] = len(losses) + 1


def _node(step: str, task: str, attempts: list[int], inputs: tuple[dict, dict, dict], now: float,
          gangs: dict[tuple[str, int], tuple[dict, float | None, dict]] | None = None) -> dict[str, Any] | None:
    manifests, jobs, snaps = inputs
    rows = []
    for i, a in enumerate(attempts):
        key = (step, task, a)
        nxt = next((snaps[k] for b in attempts[i + 1:] if (k := (step, task, b)) in snaps), None)
        kept_at = None
        if nxt is not None and nxt.get("start_step") is not None:
            kept_at = int(nxt["start_step"])  # where the next attempt resumed: what this one kept
        row = _attempt(key, manifests.get(key), jobs.get(key), snaps.get(key), kept_at, now)
        gang = (gangs or {}).get((step, a))
        if row is not None and gang is not None and key in gang[2]:  # hot spares: one attempt, several generations
            _generations(row, manifests.get(key) or {}, gang[2][key], gang[0], gang[1], kept_at, jobs.get(key))
        if row is not None:
            rows.append(row)
    if not rows:
        return None
    for prev, row in zip(rows, rows[1:], strict=False):  # a retry's wait: from one attempt's end to the next's begin
        gap = row["begin"] - prev["end"]
        row["seconds"]["retry_wait"] = max(0.0, gap)
        row["wall_s"] += gap
        if gap < 0:  # overlapping clocks: taken out of this attempt's own time, said in the notes
            row["overlap_s"] += _settle(row["seconds"], row["wall_s"])
    seconds = _sum(r["seconds"] for r in rows)
    node = next((m["parallel"].get("node_index") for m in (manifests.get((step, task, a)) for a in attempts)
                 if m and isinstance(m.get("parallel"), dict)), None)
    if node is None:  # no manifest says it (running): the trainer's node rank
        node = next((s.get("node") for s in (snaps.get((step, task, a)) for a in attempts) if s), None)
    return {"task_id": task, "node": node, "begin": rows[0]["begin"], "end": rows[-1]["end"],
            "wall_s": rows[-1]["end"] - rows[0]["begin"], "seconds": seconds, "attempts": rows}


def _sum(many: Any) -> dict[str, float]:
    out = dict.fromkeys(CATEGORIES, 0.0)
    for sec in many:
        for k, v in sec.items():
            out[k] += v
    return out


def _ratios(seconds: dict[str, float], wall: float) -> dict[str, float | None]:
    paid = wall - sum(seconds[k] for k in PAID_EXCLUDES)
    return {"paid_s": paid, "goodput": seconds["productive"] / paid if paid > 0 else None,
            "ettr": seconds["productive"] / wall if wall > 0 else None}


def _cost(nodes: list[dict], price: Price | None) -> dict[str, Any] | None:
    """USD of the paid, lost and non-productive node-time, at the backend's price of each attempt's instance type."""
    if price is None:
        return None
    out = {"paid_usd": 0.0, "lost_usd": 0.0, "not_productive_usd": 0.0, "prices": {}, "unpriced_s": 0.0}
    for node in nodes:
        for a in node["attempts"]:
            sec = a["seconds"]
            paid = a["wall_s"] - sum(sec[k] for k in PAID_EXCLUDES)
            per_hour = price(a["instance_type"]) if a["instance_type"] else None
            if per_hour is None:
                out["unpriced_s"] += paid
                continue
            out["prices"][a["instance_type"]] = per_hour
            out["paid_usd"] += paid * per_hour / 3600
            out["lost_usd"] += sec["lost"] * per_hour / 3600
            out["not_productive_usd"] += (paid - sec["productive"]) * per_hour / 3600
    return out if out["prices"] else None


def _advice(lead: dict, nodes: int, checkpoint: dict, step_s: float | None, env_hours: float | None
            ) -> dict[str, Any] | None:
    """The checkpoint interval advice (stoker.store.checkpoint_advice) from the measured blocking save and step times;
    the MTBF: ``$STOKER_MTBF_HOURS`` when the reader gives it, else the one observed (node 0's paid time over its
    failed attempts, but for causes that say nothing of the hardware), else the one the trainer was given
    (``checkpoint.mtbf_hours`` or its ``$STOKER_MTBF_HOURS``), else the assumed one. None without a measured save
    or step time."""
    if not checkpoint["saves"] or checkpoint["mean_blocking_s"] is None or not step_s:
        return None
    failed = _failures(lead)
    paid = _ratios(lead["seconds"], lead["wall_s"])["paid_s"]
    policy = next((a["checkpoint_policy"] for a in reversed(lead["attempts"]) if a.get("checkpoint_policy")), {})
    if env_hours is None and failed and paid > 0:
        mtbf, source = paid / failed, "observed"
        note = f"observed from {failed} failure{'s' if failed > 1 else ''}"
    elif env_hours is not None:
        mtbf, source, note = job_mtbf(env_hours, nodes, "env")
    else:  # what the trainer was given (its setting or environment), else the assumed MTBF
        hours, given = _num(policy.get("mtbf_hours")), policy.get("mtbf_source") in ("setting", "env")
        mtbf, source, note = job_mtbf(hours, nodes, policy["mtbf_source"]) if hours and given else \
            job_mtbf(NODE_MTBF_HOURS, nodes, "assumed")
    return {**advise(checkpoint["mean_blocking_s"], step_s, mtbf, source=source, mtbf_note=note,
                     every_steps=checkpoint["every_steps"], failures=failed), "auto": bool(policy.get("auto"))}


def _failures(lead: dict) -> int:
    """The failures node 0's records saw, for the MTBF: its failed attempts but for causes that say nothing of the
    hardware, and every node a spare replaced (a loss the gang absorbed is a failure all the same; it cost the work
    since the last checkpoint)."""
    failed = sum(1 for a in lead["attempts"] if a["status"] == "failed" and a.get("cause") not in NOT_FAILURES)
    return failed + sum(max(0, int(a.get("generations") or 1) - 1) for a in lead["attempts"])


def _step(step: str, nodes: list[dict], price: Price | None, env_hours: float | None = None) -> dict[str, Any]:
    seconds = _sum(n["seconds"] for n in nodes)
    node_s = sum(n["wall_s"] for n in nodes)
    span = max(n["end"] for n in nodes) - min(n["begin"] for n in nodes)
    lead = min(nodes, key=lambda n: (n["node"] is None, n["node"] or 0))  # the gang's node 0 speaks for its steps
    tokens = sum(max(0, a["steps"]["kept"] - a["steps"]["first"]) * a["tokens_per_step"]
                 for a in lead["attempts"] if a["steps"])
    steps_s = sum(a["steps"]["mean_step_s"] * (a["steps"]["last"] - a["steps"]["first"])
                  for a in lead["attempts"] if a["steps"] and a["steps"]["mean_step_s"])
    n_steps = sum(a["steps"]["last"] - a["steps"]["first"] for a in lead["attempts"] if a["steps"])
    saves = sum(a["saves"] for a in lead["attempts"])
    failures = sum(1 for a in lead["attempts"] if a["status"] == "failed") \
        + sum(max(0, int(a.get("generations") or 1) - 1) for a in lead["attempts"])  # nodes spares replaced
    every = next((a["checkpoint_every"] for a in reversed(lead["attempts"]) if a["checkpoint_every"]), None)
    checkpoint = {"saves": saves, "every_steps": every, "blocking_s": lead["seconds"]["checkpoint_save"],
                  "mean_blocking_s": lead["seconds"]["checkpoint_save"] / saves if saves else None}
    mean_step = steps_s / n_steps if n_steps else None
    checkpoint["advice"] = _advice(lead, len(nodes), checkpoint, mean_step, env_hours)
    return {"step": step, "nodes": len(nodes), "wall_s": span, "node_seconds": node_s, "seconds": seconds,
            **_ratios(seconds, node_s), "tokens": tokens,
            "tokens_per_s": tokens / span if span > 0 else None,
            "tokens_per_productive_s": tokens / productive if (productive := lead["seconds"]["productive"]) else None,
            "mean_step_s": mean_step, "failures": failures,
            "mtbf_s": _ratios(lead["seconds"], lead["wall_s"])["paid_s"] / failures if failures else None,
            "checkpoint": checkpoint,
            "cost": _cost(nodes, price), "tasks": nodes}


def run_goodput(store: BlobStore, flow: str, run_id: str, *, price: Price | None = None,
                now: float | None = None, mtbf_hours: float | None = None) -> dict[str, Any]:
    """The run's goodput ledger (see the module's docstring). ``price`` (instance type -> USD per node-hour) prices
    the attempts whose job recorded an instance type (Batch); without it, or them, ``cost`` is None. ``mtbf_hours``
    (one node's MTBF; default ``$STOKER_MTBF_HOURS``, if set) overrides the observed MTBF in the checkpoint advice."""
    now = time.time() if now is None else now
    mtbf_hours = env_mtbf_hours() if mtbf_hours is None else mtbf_hours
    notes: list[str] = []
    manifests, jobs, ledgers = _read_inputs(store, flow, run_id, notes)
    snaps = {}
    for key in sorted(ledgers):
        snap = latest_snapshot(store, flow, run_id, *key)
        if snap is not None and isinstance(snap.get("seconds"), dict) and _num(snap.get("created_at")) is not None:
            snaps[key] = snap
    gangs: dict[tuple[str, int], tuple[dict, float | None, dict]] = {}  # (step, attempt) -> a gang with a lost node
    for step in sorted({s for s, _, _ in ledgers}):
        found = [g for g in step_gangs(store, flow, run_id, step) if len(g["generations"]) > 1]
        for g in found:
            if sum(1 for h in found if h["attempt"] == g["attempt"]) > 1:
                continue  # several gangs of one step and attempt: which node is whose is not known; left as is
            start = _num((manifests.get((step, g["task_id"], g["attempt"])) or {}).get("started_at"))
            segs = {k: seg for k in ledgers if k[0] == step and k[2] == g["attempt"]
                    and (seg := [x for x in ledger_segments(store, flow, run_id, *k)
                                 if isinstance(x.get("seconds"), dict) and _num(x.get("created_at")) is not None
                                 and _num(x.get("time")) is not None])}
            if start is None:  # node 0 still running: its first trainer's start
                start = min((_num(x[0].get("process_started_at")) or float(x[0]["created_at"]) for x in segs.values()),
                            default=None)
            gangs[(step, g["attempt"])] = (g, start, segs)
    attempts: dict[tuple[str, str], set[int]] = {}
    for step, task, attempt in set(manifests) | set(jobs) | set(snaps):
        attempts.setdefault((step, task), set()).add(attempt)
    steps = []
    for step in sorted({s for s, _ in attempts}):
        nodes = [n for task in sorted((t for s, t in attempts if s == step), key=lambda t: (len(t), t))
                 if (n := _node(step, task, sorted(attempts[(step, task)]), (manifests, jobs, snaps), now, gangs))]
        if nodes:
            steps.append({**_step(step, nodes, price, mtbf_hours),
                          "generations": [g for (s, _), (g, _, _) in sorted(gangs.items()) if s == step]})
    seconds = _sum(s["seconds"] for s in steps)
    node_s = sum(s["node_seconds"] for s in steps)
    other = seconds["other"]
    if node_s and other > 0.01 * node_s:
        notes.append(f"{other:.1f} s ({100 * other / node_s:.1f} %) of the node-time is not explained by the "
                     "records (`other`): clocks of different hosts, or an attempt whose records are incomplete")
    overlap = sum(a.get("overlap_s") or 0.0 for s in steps for n in s["tasks"] for a in n["attempts"])
    if node_s and overlap > 0.01 * node_s:
        notes.append(f"{overlap:.1f} s ({100 * overlap / node_s:.1f} %) of the node-time is counted twice by the "
                     "records (clocks of different hosts); taken out of the queue and start-up first")
    costs = [s["cost"] for s in steps if s["cost"]]
    total_cost = {k: sum(c[k] for c in costs) for k in ("paid_usd", "lost_usd", "not_productive_usd", "unpriced_s")} \
        if costs else None
    if total_cost is not None:
        total_cost["prices"] = {k: v for c in costs for k, v in c["prices"].items()}
    total = {"node_seconds": node_s, "seconds": seconds, **_ratios(seconds, node_s),
             "tokens": sum(s["tokens"] for s in steps), "cost": total_cost}
    return {"version": VERSION, "flow": flow, "run_id": run_id, "categories": list(CATEGORIES), "total": total,
            "steps": steps, "notes": notes}
