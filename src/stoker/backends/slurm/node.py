"""What every node of a Slurm job runs: `python -m stoker.backends.slurm.node --store URL --code KEY --spec KEY`
(the sbatch script's srun line): the member side's node agent (runtime/member/node.py), told how to read
Slurm's variables: `SLURM_ARRAY_TASK_ID` (an array element) or `SLURM_NODEID` (a gang node, one task per node),
`SLURM_JOB_NUM_NODES`, the first host of `SLURM_JOB_NODELIST`, a port derived from `SLURM_JOB_ID`, and the node's
name in Slurm (`SLURMD_NODENAME`: what a lost node's heartbeat names).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping

from stoker.backends.slurm.states import expand_hostlist
from stoker.runtime.member.node import main
from stoker.runtime.member.nodeenv import NodeEngine, NodeIdentity

PORT_BASE, PORT_SPAN = 12000, 20000  # below Linux's ephemeral range (32768-60999)


def port_for_job(job_id: str) -> int:
    """A rendezvous port that differs between jobs (and so between retries of a gang)."""
    digits = re.sub(r"\D", "", str(job_id)) or "0"
    return PORT_BASE + (int(digits) * 7919) % PORT_SPAN


def slurm_identity(env: Mapping[str, str]) -> NodeIdentity | None:
    if "SLURM_JOB_ID" not in env:
        return None
    member = int(env.get("SLURM_ARRAY_TASK_ID") or env.get("SLURM_NODEID") or 0)
    hosts = expand_hostlist(env.get("SLURM_JOB_NODELIST", "")) or [socket.gethostname()]
    return NodeIdentity(member, int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1), hosts[0],
                        port_for_job(env["SLURM_JOB_ID"]), env.get("SLURMD_NODENAME", ""))


SLURM = NodeEngine("slurm", slurm_identity)

if __name__ == "__main__":
    main(engine=SLURM)
