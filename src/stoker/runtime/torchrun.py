"""`current.torch.run(...)` for @torchrun steps: launch torchrun with the gang's nnodes, node_rank and master."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._process import die_with_parent
from ..errors import StokerError
from ..flow.current import ParallelInfo
from ..flow.decorators import get_decorator

log = logging.getLogger(__name__)


def derive_nproc_per_node(resources: Mapping[str, Any] | None) -> tuple[int, str]:
    """Processes per node from @resources: GPUs, else NeuronCores (2 per Trainium device), else CPUs, else 1."""
    r = resources or {}
    if r.get("gpu"):
        return int(r["gpu"]), f"@resources(gpu={int(r['gpu'])})"
    if r.get("trainium"):
        return 2 * int(r["trainium"]), f"@resources(trainium={int(r['trainium'])}) x 2 NeuronCores"
    if r.get("cpu"):
        return max(1, int(r["cpu"])), f"@resources(cpu={int(r['cpu'])})"
    return 1, "default (no @resources)"


def _args_list(args: Mapping[str, Any] | Sequence[str] | None) -> list[str]:
    if args is None:
        return []
    if isinstance(args, Mapping):
        out: list[str] = []
        for k, v in args.items():
            flag = k if k.startswith("-") else f"--{k}"
            if v is True:
                out.append(flag)
            elif v is False or v is None:
                continue
            else:
                out += [flag, str(v)]
        return out
    return [str(a) for a in args]


@dataclass
class TorchrunHelper:
    """Launches torchrun on this gang node; rank 0 lives on node 0 (the gang's main node)."""

    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    nproc_per_node: int
    nproc_source: str
    max_restarts: int = 0
    tee: bool = True

    @classmethod
    def for_task(cls, func: Any, par: ParallelInfo) -> TorchrunHelper:
        deco = get_decorator(func, "torchrun")
        res = get_decorator(func, "resources")
        attrs = deco.attributes if deco else {}
        if attrs.get("nproc_per_node"):
            n, src = int(attrs["nproc_per_node"]), "@torchrun(nproc_per_node=...)"
        else:
            n, src = derive_nproc_per_node(res.attributes if res else None)
        port = attrs.get("master_port") or par.port or 29500
        return cls(nnodes=par.num_nodes, node_rank=par.node_index, master_addr=par.main_ip,
                   master_port=int(port), nproc_per_node=n, nproc_source=src,
                   max_restarts=int(attrs.get("max_restarts") or 0), tee=bool(attrs.get("tee", True)))

    def command(self, entrypoint: str, args: Any = None, module: bool | None = None,
                nproc_per_node: int | None = None) -> list[str]:
        is_module = module if module is not None else not entrypoint.endswith(".py")
        cmd = [sys.executable, "-m", "torch.distributed.run",
               f"--nnodes={self.nnodes}", f"--node_rank={self.node_rank}",
               f"--nproc_per_node={nproc_per_node or self.nproc_per_node}",
               f"--master_addr={self.master_addr}", f"--master_port={self.master_port}",
               f"--max_restarts={self.max_restarts}"]
        if self.tee:
            cmd += ["--tee=3"]  # every rank's output, prefixed with its rank, on this node's log
        cmd += (["-m", entrypoint] if is_module else [entrypoint]) + _args_list(args)
        return cmd

    def run(self, entrypoint: str, args: Any = None, entrypoint_args: Any = None, module: bool | None = None,
            nproc_per_node: int | None = None, env: Mapping[str, str] | None = None, **_: Any) -> None:
        """Run `entrypoint` (a module like `stoker.train`, or a script path) under torchrun; raise on failure."""
        cmd = self.command(entrypoint, args if args is not None else entrypoint_args, module, nproc_per_node)
        source = "given to current.torch.run" if nproc_per_node else self.nproc_source
        print(f"torchrun: node {self.node_rank}/{self.nnodes}, {nproc_per_node or self.nproc_per_node} "
              f"processes per node ({source}), master {self.master_addr}:{self.master_port}", flush=True)
        full_env = {**os.environ, **(env or {})}
        full_env.setdefault("OMP_NUM_THREADS", "1")
        proc = subprocess.Popen(cmd, env=full_env, preexec_fn=die_with_parent)
        try:
            rc = proc.wait()
        except BaseException:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
        if rc != 0:
            raise StokerError(f"torchrun exited with code {rc} on node {self.node_rank} (command: {' '.join(cmd)})")
