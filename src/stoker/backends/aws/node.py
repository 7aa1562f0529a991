"""What every node of a Batch job runs: `python -m stoker.backends.aws.node --store URL --code KEY --spec KEY`
(the job definition's command): the member side's node agent (runtime/member/node.py), told how to read Batch's
variables (`AWS_BATCH_JOB_NODE_INDEX`, `AWS_BATCH_JOB_NUM_NODES`, `AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS`,
absent on the main node itself) and that the main node of a gang waits for the others before it exits.
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Mapping

from stoker.runtime.member.node import main
from stoker.runtime.member.nodeenv import NodeEngine, NodeIdentity, node_identity
from stoker.runtime.spec import TaskSpec
from stoker.store.blobs import BlobStore
from stoker.store.manifest import log_name


def batch_identity(env: Mapping[str, str]) -> NodeIdentity | None:
    if "AWS_BATCH_JOB_NODE_INDEX" not in env:
        return None
    main_addr = env.get("AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS")
    return NodeIdentity(int(env["AWS_BATCH_JOB_NODE_INDEX"]), int(env.get("AWS_BATCH_JOB_NUM_NODES", "1")),
                        main_addr or _own_address(), 29500)


def _own_address() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def wait_for_members(store: BlobStore, doc: dict, spec: TaskSpec, env: Mapping[str, str],
                     poll_s: float = 1.0) -> None:
    """A Batch multi-node job ends when its main node exits (Batch stops every other node then): node 0 of a gang
    waits until the others have written their manifests and logs, so their results are not cut off. Bounded:
    `$STOKER_MAIN_NODE_WAIT` seconds (default 300); a node that died meanwhile is the scheduler's to see (its job
    ends, the gang fails), not ours to wait for."""
    if doc.get("kind") != "gang" or "AWS_BATCH_JOB_NODE_INDEX" not in env or node_identity(env, BATCH).member != 0:
        return
    others = [TaskSpec.from_dict(s) for s in doc["specs"][1:]]
    waiting = {log_name(s.flow, s.run_id, s.step, s.task_id, s.attempt, "stderr") for s in others}
    deadline = time.monotonic() + float(env.get("STOKER_MAIN_NODE_WAIT", "300"))
    while waiting and time.monotonic() < deadline:
        waiting = {n for n in waiting if not store.exists(n)}  # the final stderr log is the last thing a node writes
        if waiting:
            time.sleep(poll_s)
    if waiting:
        print(f"stoker: {len(waiting)} node(s) of the gang did not finish within STOKER_MAIN_NODE_WAIT; the main "
              f"node exits now, which ends the job", file=sys.stderr, flush=True)


BATCH = NodeEngine("batch", batch_identity, wait_for_members)

if __name__ == "__main__":
    main(engine=BATCH)
