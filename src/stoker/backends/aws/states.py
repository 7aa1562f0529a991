"""Batch job descriptions (DescribeJobs) -> JobStatus.

A multi-node job's nodes are its child jobs `<id>#<node>`: each has its own status, exit code, reason, address
and log stream, so a failed node names itself. SUBMITTED, PENDING, RUNNABLE and STARTING are queued; a job that
waits in RUNNABLE with a MISCONFIGURATION reason will never start as submitted (it is "blocked").
"""

from __future__ import annotations

from typing import Any

from stoker.runtime.contract import EXITED, QUEUED, RUNNING, JobStatus

QUEUED_STATES = {"SUBMITTED", "PENDING", "RUNNABLE", "STARTING"}
BLOCKED_PREFIXES = ("MISCONFIGURATION",)
# a job (or node) whose EC2 instance went away: FAILED with this status reason and no exit code
HOST_LOST_PREFIX = "Host EC2"


def _seconds(ms: Any) -> float | None:
    return ms / 1000.0 if isinstance(ms, (int, float)) and ms else None


def container(desc: dict[str, Any]) -> dict[str, Any]:
    """The container part of a description: the job's own, else its last attempt's."""
    attempts = desc.get("attempts") or []
    last = (attempts[-1].get("container") if attempts else None) or {}
    return {**last, **{k: v for k, v in (desc.get("container") or {}).items() if v not in (None, "", [])}}


def log_stream(desc: dict[str, Any]) -> str | None:
    return container(desc).get("logStreamName") or None


def address(desc: dict[str, Any]) -> str | None:
    for ni in container(desc).get("networkInterfaces") or []:
        if ni.get("privateIpv4Address"):
            return ni["privateIpv4Address"]
    return None


def reason(desc: dict[str, Any]) -> str | None:
    c = container(desc)
    parts = [p for p in (desc.get("statusReason"), c.get("reason")) if p]
    return "; ".join(dict.fromkeys(parts)) or None


def status_of(desc: dict[str, Any]) -> JobStatus:
    """One job (or one node's child job)."""
    state = desc.get("status", "SUBMITTED")
    why = reason(desc)
    started = _seconds(desc.get("startedAt"))
    hosts = [a for a in [address(desc)] if a]
    if state in QUEUED_STATES:
        blocked = state == "RUNNABLE" and bool(why) and why.startswith(BLOCKED_PREFIXES)
        return JobStatus(QUEUED, reason=why if blocked else None, blocked=blocked)
    if state == "RUNNING":
        return JobStatus(RUNNING, started_at=started, hosts=hosts)
    if state == "SUCCEEDED":
        return JobStatus(EXITED, exit_code=0, started_at=started, hosts=hosts)
    code = container(desc).get("exitCode")
    if not isinstance(code, int) and (desc.get("statusReason") or "").startswith(HOST_LOST_PREFIX):
        # its instance was lost, with everything on it: no process exited, so there is no exit code (a gang with
        # spares takes such a node for lost: runtime/driver/spares.py)
        return JobStatus(EXITED, exit_code=None, started_at=started, hosts=hosts, reason=why)
    return JobStatus(EXITED, exit_code=int(code) if isinstance(code, int) and code != 0 else 1,
                     started_at=started, hosts=hosts, reason=why or "failed")


def job_status(parent: dict[str, Any], nodes: dict[int, dict[str, Any]]) -> JobStatus:
    """A job with its nodes' child jobs (multi-node): each member's own status, the first failure named."""
    st = status_of(parent)
    for i, desc in sorted(nodes.items()):
        m = status_of(desc)
        if m.state == EXITED and m.exit_code:
            m.reason = f"node {i}: exit code {m.exit_code}" + (f" ({m.reason})" if m.reason else "")
        elif m.state == EXITED and m.exit_code is None:
            m.reason = f"node {i}: {m.reason}"
        st.members[i] = m
        st.hosts += [h for h in m.hosts if h not in st.hosts]
    if st.blocked:  # the job will never start as submitted: so will none of its nodes
        for m in st.members.values():
            if m.state == QUEUED:
                m.blocked, m.reason = True, st.reason
    failed = [i for i, m in sorted(st.members.items()) if m.state == EXITED and m.exit_code != 0]
    if st.state == EXITED and st.exit_code and failed:
        first = st.members[failed[0]]
        st.reason = first.reason + (f"; job: {st.reason}" if st.reason and st.reason != "failed" else "")
    return st
