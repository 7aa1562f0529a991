"""Slurm job states and exit codes -> stoker's JobStatus (pure; tests feed it recorded lines)."""

from __future__ import annotations

import re
import time

from stoker.backends.slurm.client import SlurmRecord
from stoker.runtime.contract import EXITED, QUEUED, RUNNING, JobRef, JobStatus

QUEUED_STATES = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD",
                 "SUSPENDED"}
RUNNING_STATES = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING", "STOPPED", "UPDATE_DB"}
EXITED_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                 "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"}

CANCELLED = "cancelled (scancel)"
REASONS = {
    "CANCELLED": CANCELLED,
    "TIMEOUT": "hit the Slurm time limit (raise @slurm(time=...))",
    "NODE_FAIL": "a node failed (NODE_FAIL: a node of the job stopped answering slurmctld)",
    "OUT_OF_MEMORY": "ran out of memory (raise @slurm(mem=...))",
    "PREEMPTED": "preempted",
    "BOOT_FAIL": "a node failed to boot",
    "DEADLINE": "missed its Slurm deadline",
    "REVOKED": "revoked by Slurm (federation)",
}
# The code of a job that ended abnormally although Slurm says 0:0 (the completion log does for NODE_FAIL).
_ABNORMAL_CODE = {"OUT_OF_MEMORY": -9, "FAILED": 1, "BOOT_FAIL": 1, "SPECIAL_EXIT": 1}
_QUIET_REASONS = {"", "None", "NonZeroExitCode", "(null)", "Priority", "Resources"}
# pending reasons that never clear by waiting: the job as submitted asks for what the cluster does not allow
BLOCKED_REASONS = {
    "BadConstraints": "no node has the requested features/constraint",
    "PartitionNodeLimit": "more nodes than the partition allows a job",
    "PartitionConfig": "more nodes, CPUs or memory than the partition has or allows a job",
    "PartitionTimeLimit": "a longer time limit than the partition allows",
    "InvalidAccount": "the account does not exist or you may not use it (@slurm(account=...))",
    "InvalidQOS": "the QOS does not exist or you may not use it (@slurm(qos=...))",
    "DependencyNeverSatisfied": "a dependency that can never be satisfied",
    "QOSMaxWallDurationPerJobLimit": "a longer time limit than the QOS allows",
    "AssocMaxWallDurationPerJobLimit": "a longer time limit than your association allows",
    "QOSMaxNodePerJobLimit": "more nodes than the QOS allows a job",
    "AssocMaxNodesPerJobLimit": "more nodes than your association allows a job",
    "QOSMaxCpuPerJobLimit": "more CPUs than the QOS allows a job",
    "AssocMaxCpuPerJobLimit": "more CPUs than your association allows a job",
}


def state_kind(state: str) -> str:
    """queued / running / exited for a Slurm state (`CANCELLED by 0`, `CANCELLED+` and the like included)."""
    base = state.split()[0].rstrip("+") if state.strip() else "UNKNOWN"
    if base in EXITED_STATES:
        return EXITED
    if base in QUEUED_STATES:
        return QUEUED
    return RUNNING if base in RUNNING_STATES else QUEUED


def exit_code(state: str, code: str) -> int:
    """`X:S` -> X, or -S when a signal S ended it; never 0 for a job that did not complete."""
    base = state.split()[0].rstrip("+") if state.strip() else ""
    x, _, s = (code or "0:0").partition(":")
    value = -int(s) if s.isdigit() and int(s) > 0 else (int(x) if x.isdigit() else 0)
    if value == 0 and base != "COMPLETED":
        value = _ABNORMAL_CODE.get(base, -15)  # cancelled, timed out, preempted, node failure: TERMinated
    return value


def epoch(stamp: str) -> float | None:
    """Slurm's local-time `2026-12-03T11:33:54` -> epoch seconds (None for Unknown / None / N/A)."""
    try:
        return time.mktime(time.strptime(stamp.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def hosts(nodelist: str) -> list[str]:
    nodelist = nodelist.strip()
    if not nodelist or nodelist in ("None", "(null)", "None assigned") or nodelist.startswith("("):
        return []
    return expand_hostlist(nodelist)


def record_status(rec: SlurmRecord, cancelled: bool = False) -> JobStatus:
    """One job or array element."""
    kind = state_kind(rec.state)
    base = rec.state.split()[0].rstrip("+") if rec.state.strip() else "UNKNOWN"
    st = JobStatus(state=kind)
    if kind == QUEUED:
        st.reason = f"Slurm: {rec.reason}" if rec.reason not in _QUIET_REASONS else None
        if rec.reason in BLOCKED_REASONS:
            st.blocked = True
            st.reason = f"Slurm will never start it ({rec.reason}: {BLOCKED_REASONS[rec.reason]}); change the request"
        return st
    st.started_at = epoch(rec.start)
    st.hosts = hosts(rec.nodes)
    if kind == EXITED:
        st.exit_code = exit_code(rec.state, rec.exit_code)
        st.reason = CANCELLED if cancelled and base != "COMPLETED" else REASONS.get(base)
        if st.reason is None and rec.reason not in _QUIET_REASONS:
            st.reason = f"Slurm: {rec.reason}"  # e.g. JobLaunchFailure
    return st


def job_status(ref: JobRef, records: list[SlurmRecord], cancelled: bool = False) -> JobStatus | None:
    """The status of `ref` from its records (None when Slurm reported nothing about it)."""
    if not records:
        return None
    if ref.kind != "array":
        return record_status(records[-1], cancelled)
    members: dict[int, JobStatus] = {}
    for rec in records:
        if rec.index is not None:
            members[rec.index] = record_status(rec, cancelled)
        for i in rec.pending:
            members.setdefault(i, record_status(rec))
    for i in range(ref.members):
        members.setdefault(i, JobStatus(state=QUEUED))
    kinds = {m.state for i, m in members.items() if i < ref.members}
    state = EXITED if kinds == {EXITED} else QUEUED if kinds == {QUEUED} else RUNNING
    started = [m.started_at for m in members.values() if m.started_at is not None]
    all_hosts = sorted({h for m in members.values() for h in m.hosts})
    st = JobStatus(state=state, started_at=min(started) if started else None, hosts=all_hosts, members=members)
    if state == EXITED:
        failed = [members[i] for i in sorted(members) if members[i].exit_code]
        st.exit_code = failed[0].exit_code if failed else 0
        st.reason = failed[0].reason if failed else None
    return st


def spare_members(ref: JobRef, st: JobStatus) -> tuple[JobStatus, list[int]]:
    """A gang with spares (`--no-kill`): Slurm removes a failed node from the running job's NodeList and the job goes
    on. Member i is the i-th host of the job's first NodeList (kept in `ref.extra["hosts"]`, so a node's index and
    host stay as they were): a member whose host left the list has EXITED, lost (a signal's negative code, a reason
    naming NODE_FAIL), while the others keep the job's state. Returns the status and the lost members' indices."""
    full = list(ref.extra.get("hosts") or [])
    if len(full) != ref.members:
        if len(st.hosts) != ref.members:
            return st, []  # not seen whole yet (queued, or first seen after a loss): the job's status stands
        full = list(st.hosts)
    lost = [i for i, h in enumerate(full) if h not in st.hosts] if st.state == RUNNING else []
    for i in lost:
        st.members[i] = JobStatus(state=EXITED, exit_code=-9, started_at=st.started_at, hosts=[full[i]],
                                  reason=f"node {full[i]} failed (NODE_FAIL): Slurm removed it from the job, "
                                         f"which goes on without it (--no-kill)")
    st.hosts = full
    return st, lost


def expand_hostlist(spec: str) -> list[str]:
    """Slurm's compressed host lists: `n[1-3,5],gpu07` -> n1 n2 n3 n5 gpu07 (zero padding kept)."""
    hosts: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?", spec):
        prefix, ranges = m.group(1), m.group(2)
        if not ranges:
            hosts.append(prefix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            for i in range(int(lo), int(hi or lo) + 1):
                hosts.append(f"{prefix}{str(i).zfill(len(lo))}")
    return hosts
