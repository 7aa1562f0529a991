"""What every node of a Batch job runs: `python -m stoker.backends.aws.node --store URL --code KEY --spec KEY`
(the job definition's command): the member side's node agent (runtime/member/node.py), told how to read Batch's
variables (`AWS_BATCH_JOB_NODE_INDEX`, `AWS_BATCH_JOB_NUM_NODES`, `AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS`,
absent on the main node itself) and that the main node of a gang waits for the others before it exits.

What Batch does with the nodes of a multi-node parallel job (AWS Batch User Guide: "Job lifecycle for MNP jobs",
"Multi-node parallel jobs", "Environment variables" (mnp-env-vars), "Automated job retries"):
- the main node (index 0 here: `mainNode 0`) starts first; the child nodes start once it runs, in no set order;
- each node is a child job `<job>#<i>` that ends SUCCEEDED or FAILED by its own exit code. A child whose container
  fails or whose instance is lost (its child job FAILED; for a lost host the status reason reads
  `Host EC2 (instance i-...) terminated.`) changes nothing else: "If a child node dies, AWS Batch doesn't take any
  action on the other nodes in the job", and it is not replaced: the job runs on with one node fewer;
- "The job is finished only if the main node exits. All child nodes are then stopped" (SIGTERM, then SIGKILL after
  ECS's stop timeout), and the job's status, stop time, reason and exit code are the main node's; a main node
  lost with its instance fails the whole job the same way;
- Batch's own retries (`retryStrategy`, which stoker leaves at 1 attempt) would rerun the whole job on a main node
  failure and never on a child's;
- `AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS` is set on the child nodes only: no node is told its own address.

So a gang with hot spares (`@torchrun(spares=k)`, distributed/gangboard.py) is one job of N + k nodes whose main
node is kept as the *last* spare (`BatchBackend.main_node_spare`): generation 0 runs on nodes 1..N, a lost child's
slot goes to a waiting child first, and the main node runs a slot only when no other spare is left. A child's loss
is recovered inside the job; the main node's loss ends the job (nothing can keep it alive), and the scheduler's
whole-gang `@retry` resumes from the last committed checkpoint. The main node must outlive the gang: whether it
waits as a spare (runtime/member/standby.py: until the driver writes `gang/end.json`) or ran a slot, it exits only
once every slot's node is done (its final log is in the store) or the gang was stopped (`wait_for_gang_end`).
"""

from __future__ import annotations

import functools
import json
import os
import socket
import sys
import time
import urllib.request
from collections.abc import Mapping

from stoker.runtime.member.node import main
from stoker.runtime.member.nodeenv import NodeEngine, NodeIdentity, node_identity
from stoker.runtime.spec import TaskSpec
from stoker.store.blobs import BlobStore
from stoker.store.manifest import log_name

RDZV_PORT = 29500
METADATA_TIMEOUT_S = 2.0


def batch_identity(env: Mapping[str, str]) -> NodeIdentity | None:
    if "AWS_BATCH_JOB_NODE_INDEX" not in env:
        return None
    own = _own_address(env.get("ECS_CONTAINER_METADATA_URI_V4") or "")
    main_addr = env.get("AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS")
    return NodeIdentity(int(env["AWS_BATCH_JOB_NODE_INDEX"]), int(env.get("AWS_BATCH_JOB_NUM_NODES", "1")),
                        main_addr or own, RDZV_PORT, addr=own)


@functools.lru_cache(maxsize=4)
def _own_address(metadata_uri: str = "") -> str:
    """This container's private IPv4 address: the ECS task metadata endpoint's (v4, which the ECS agent gives every
    container; a multi-node job runs in awsvpc mode, so it is the job's own network interface, where the other
    nodes reach this one), else what the host name resolves to (in awsvpc mode, the same interface)."""
    if metadata_uri:
        try:
            direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # link-local: never via a proxy
            with direct.open(metadata_uri, timeout=METADATA_TIMEOUT_S) as r:
                doc = json.loads(r.read())
            for net in doc.get("Networks") or []:
                for ip in net.get("IPv4Addresses") or []:
                    if ip:
                        return str(ip)
        except (OSError, ValueError, AttributeError):
            pass  # an older agent or a blip: the host name's address below
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _is_main(env: Mapping[str, str]) -> bool:
    return "AWS_BATCH_JOB_NODE_INDEX" in env and node_identity(env, BATCH).member == 0


def _slot_logs(doc: dict) -> set[str]:
    """The final stderr logs of the gang's nodes (the last thing a node writes; whichever member ran the slot)."""
    specs = [s if isinstance(s, TaskSpec) else TaskSpec.from_dict(s) for s in doc["specs"]]
    return {log_name(s.flow, s.run_id, s.step, s.task_id, s.attempt, "stderr") for s in specs}


def wait_for_gang_end(store: BlobStore, doc: dict, env: Mapping[str, str], poll_s: float = 1.0,
                      deadline: float | None = None) -> str | None:
    """A gang with spares: until every node's final log is in the store (whichever member ran each slot last: the
    last thing a node writes) or the run says the gang is over (`gang/end.json`; `stopped`: at once, the run stops the
    job anyway). The run decides that a remote task is over when its member exits, so the main node, once it ran a
    slot, cannot wait for end.json alone: the end is written only after it exits. Bounded by `$STOKER_MAIN_NODE_WAIT`
    seconds (default 300). Returns the end's state, "logs" when every log came first, None when nothing came."""
    from stoker.distributed.gangboard import GangBoard

    first = doc["specs"][0]
    spec = first if isinstance(first, TaskSpec) else TaskSpec.from_dict(first)
    par = spec.parallel
    control = (par.control_task_id if par is not None else None) or spec.task_id
    board = GangBoard.of(store, spec.flow, spec.run_id, spec.step, control, spec.attempt)
    if deadline is None:
        deadline = time.monotonic() + float(env.get("STOKER_MAIN_NODE_WAIT", "300"))
    waiting = _slot_logs(doc)
    while True:
        waiting = {n for n in waiting if not store.exists(n)}
        if not waiting:
            return "logs"
        ended = board.ended()
        if ended is not None and ended != "done":
            return ended
        if time.monotonic() >= deadline:
            break
        time.sleep(poll_s)
    print(f"stoker: {len(waiting)} node(s) of the gang did not finish within STOKER_MAIN_NODE_WAIT; the main node "
          f"exits now, which ends the job", file=sys.stderr, flush=True)
    return ended


def wait_for_members(store: BlobStore, doc: dict, spec: TaskSpec, env: Mapping[str, str],
                     poll_s: float = 1.0) -> None:
    """A Batch multi-node job ends when its main node exits (Batch stops every other node then): node 0 of a gang
    waits until the others have written their manifests and logs, so their results are not cut off. Bounded:
    `$STOKER_MAIN_NODE_WAIT` seconds (default 300); a node that died meanwhile is the scheduler's to see (its job
    ends, the gang fails), not ours to wait for. A gang with spares: the main node ran a lost node's slot; it waits
    for the final logs of every slot, whichever member ran it, or the gang's end (`wait_for_gang_end`)."""
    if doc.get("kind") != "gang" or not _is_main(env):
        return
    if doc.get("spares"):
        wait_for_gang_end(store, doc, env, poll_s)
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


def spare_main_node_exits(argv: list[str], env: Mapping[str, str], poll_s: float = 1.0) -> None:
    """The main node left the gang as a spare it never needed (runtime/member/standby.py saw `gang/end.json`): before
    its exit ends the job, let the nodes that ran the gang upload their final logs (`wait_for_gang_end`; at once if
    the gang was stopped)."""
    if not _is_main(env):
        return
    try:
        args = dict(zip(argv[::2], argv[1::2], strict=False))
        from stoker.store.blobs import open_store

        store = open_store(args["--store"])
        doc = json.loads(store.get_blob(args["--spec"]))
        if doc.get("kind") == "gang" and doc.get("spares"):
            wait_for_gang_end(store, doc, env, poll_s)
    except Exception as e:  # noqa: BLE001 - waiting is a courtesy to the others; the exit itself must happen
        print(f"stoker: the main node could not wait for the gang's logs ({e})", file=sys.stderr, flush=True)


def run(argv: list[str] | None = None) -> None:
    """The entrypoint: the node agent with Batch's engine. An unused spare leaves the agent with SystemExit(0);
    on the main node that exit ends the job, so it waits for the gang's logs first."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        main(argv, engine=BATCH)
    except SystemExit as e:
        if e.code in (0, None):
            spare_main_node_exits(argv, os.environ)
        raise


BATCH = NodeEngine("batch", batch_identity, wait_for_members)

if __name__ == "__main__":
    run()
