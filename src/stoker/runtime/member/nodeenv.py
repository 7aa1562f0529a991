"""Who am I in my unit? A member learns its index, the node count, the main node's address and the
rendezvous port at run time from the engine's own environment, never from the submission.

Checked in this order:
- `STOKER_MEMBER`, `STOKER_NUM_NODES`, `STOKER_MAIN_ADDR`, `STOKER_MAIN_PORT`: set by the local backend (and
  by any backend that knows better, e.g. the Slurm batch script exports the main node's NodeAddr);
- the engine's own variables, read by the `NodeEngine` its backend hands the node entrypoint
  (backends/slurm/node.py: `SLURM_*`; backends/aws/node.py: `AWS_BATCH_*`): this side names no engine;
- else a single node on this machine.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class NodeIdentity:
    member: int = 0
    num_nodes: int = 1
    main_addr: str = "127.0.0.1"
    port: int | None = None
    host: str = ""  # the engine's name for this node (Slurm's SLURMD_NODENAME), else "" (the host name is used)
    addr: str = ""  # this node's own address, where a spare's rendezvous would be (""): see own_addr)


@dataclass(frozen=True)
class NodeEngine:
    """What an engine's node entrypoint (`python -m stoker.backends.<engine>.node`) tells the member side:
    `identity` reads the engine's environment (None: not this engine's); `after_task(store, doc, spec, env)` runs
    once the task succeeded (AWS Batch: the main node of a gang waits for the others)."""

    name: str = "generic"
    identity: Callable[[Mapping[str, str]], NodeIdentity | None] = lambda env: None
    after_task: Callable[[Any, dict, Any, Mapping[str, str]], None] | None = None


GENERIC = NodeEngine()


def node_identity(env: Mapping[str, str] | None = None, engine: NodeEngine = GENERIC) -> NodeIdentity:
    env = os.environ if env is None else env
    port = int(env["STOKER_MAIN_PORT"]) if env.get("STOKER_MAIN_PORT") else None
    addr = env.get("STOKER_MAIN_ADDR")
    if "STOKER_MEMBER" in env:
        return NodeIdentity(int(env["STOKER_MEMBER"]), int(env.get("STOKER_NUM_NODES", "1")),
                            addr or "127.0.0.1", port, addr=env.get("STOKER_NODE_ADDR", ""))
    found = engine.identity(env)
    if found is not None:  # what the launcher exported wins over what the engine's variables say
        return NodeIdentity(found.member, found.num_nodes, addr or found.main_addr, port or found.port, found.host,
                            env.get("STOKER_NODE_ADDR") or found.addr)
    return NodeIdentity(0, 1, addr or "127.0.0.1", port, addr=env.get("STOKER_NODE_ADDR", ""))


def own_addr(ident: NodeIdentity) -> str:
    """Where this node can be reached by the others of its gang: the engine's word (`addr`), the main node's
    address on member 0, else this host's address as its name resolves (127.0.0.1 for a local member)."""
    if ident.addr:
        return ident.addr
    if ident.member == 0:
        return ident.main_addr
    if ident.main_addr in ("127.0.0.1", "localhost"):
        return ident.main_addr
    import socket

    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return socket.gethostname()
