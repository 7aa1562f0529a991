"""Who am I in my unit? A member learns its index, the node count, the main node's address and the
rendezvous port at run time from the engine's own environment, never from the submission.

Checked in this order:
- `STOKER_MEMBER`, `STOKER_NUM_NODES`, `STOKER_MAIN_ADDR`, `STOKER_MAIN_PORT`: set by the local backend (and
  by any backend that knows better, e.g. the Slurm batch script exports the main node's NodeAddr);
- Slurm: `SLURM_ARRAY_TASK_ID` (an array element) or `SLURM_NODEID` (a gang node, one task per node),
  `SLURM_JOB_NUM_NODES`, the first host of `SLURM_JOB_NODELIST`, a port derived from `SLURM_JOB_ID`;
- AWS Batch multi-node: `AWS_BATCH_JOB_NODE_INDEX`, `AWS_BATCH_JOB_NUM_NODES`,
  `AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS` (absent on the main node itself).
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

PORT_BASE, PORT_SPAN = 12000, 20000  # below Linux's ephemeral range (32768-60999)


@dataclass(frozen=True)
class NodeIdentity:
    member: int = 0
    num_nodes: int = 1
    main_addr: str = "127.0.0.1"
    port: int | None = None


def port_for_job(job_id: str) -> int:
    """A rendezvous port that differs between jobs (and so between retries of a gang)."""
    digits = re.sub(r"\D", "", str(job_id)) or "0"
    return PORT_BASE + (int(digits) * 7919) % PORT_SPAN


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


def node_identity(env: Mapping[str, str] | None = None) -> NodeIdentity:
    env = os.environ if env is None else env
    port = int(env["STOKER_MAIN_PORT"]) if env.get("STOKER_MAIN_PORT") else None
    addr = env.get("STOKER_MAIN_ADDR")
    if "STOKER_MEMBER" in env:
        return NodeIdentity(int(env["STOKER_MEMBER"]), int(env.get("STOKER_NUM_NODES", "1")),
                            addr or "127.0.0.1", port)
    if "SLURM_JOB_ID" in env:
        member = int(env.get("SLURM_ARRAY_TASK_ID") or env.get("SLURM_NODEID") or 0)
        hosts = expand_hostlist(env.get("SLURM_JOB_NODELIST", "")) or [socket.gethostname()]
        return NodeIdentity(member, int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1),
                            addr or hosts[0], port or port_for_job(env["SLURM_JOB_ID"]))
    if "AWS_BATCH_JOB_NODE_INDEX" in env:
        main = env.get("AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS")
        return NodeIdentity(int(env["AWS_BATCH_JOB_NODE_INDEX"]), int(env.get("AWS_BATCH_JOB_NUM_NODES", "1")),
                            addr or main or _own_address(), port or 29500)
    return NodeIdentity(0, 1, addr or "127.0.0.1", port)


def _own_address() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
