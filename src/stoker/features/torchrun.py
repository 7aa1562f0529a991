"""`@torchrun(nproc_per_node=None, ...)`: a gang step whose nodes launch torchrun.

In the step, `current.torch.run(entrypoint="pkg.module", args={...})` starts torchrun with the gang's
`--nnodes/--node_rank/--master_addr/--master_port` (distributed/torchrun.py does the launching).
"""

from __future__ import annotations

from typing import Any

from stoker.features.hooks import backend_options, resources_request
from stoker.flow.current import current
from stoker.flow.decorators import ParallelDecorator, TaskContext, make_step_decorator


class TorchrunDecorator(ParallelDecorator):
    """A gang step whose nodes launch torchrun: `current.torch.run(entrypoint, args)` in the step."""

    name = "torchrun"
    defaults = {"nproc_per_node": None, "master_port": None, "all_nodes_started_timeout": 600,
                "rdzv_timeout": None, "max_restarts": 0, "tee": True,
                # hot spares: members started beside the gang's nodes that wait warm and take a lost node's place
                # inside the same allocation (distributed/gangboard.py)
                "spares": 0,
                # with spares: a node the trainer names a straggler is swapped for a spare after its next checkpoint
                "evict_stragglers": False,
                # Neuron: the compile cache's prefix in the store (None: not kept), and a neuron_parallel_compile
                # pass before the run (True, or a dict of flags to change for it, e.g. {"steps_this_run": 2})
                "neuron_cache": "neuron-cache/", "precompile": False,
                # flags of the command whose store URLs are copied to each node's disk first (["data_dir"])
                "stage": None}
    order = 6  # after @environment: the launcher's environment has its variables

    def task_started(self, ctx: TaskContext) -> None:
        helper = helper_for(ctx.func, ctx.parallel)
        current._set(torch=helper)
        helper.start_early()  # a node whose ranks are forked from a warm launcher: its torch imports start now

    def spares(self) -> int:
        n = self.attributes.get("spares") or 0
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            from stoker.errors import ConfigError

            raise ConfigError(f"@torchrun(spares={n!r}): give the number of spare nodes, an int of 0 or more")
        return n

    def plan_problem(self, resources: dict[str, Any], options: dict[str, Any]) -> str | None:
        """spares that are no count of nodes, or with max_restarts (torchrun's, which a gang with spares does not
        run); nproc_per_node that the node's devices cannot take (distributed/accel.py)."""
        k = self.attributes.get("spares") or 0
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            return f"@torchrun(spares={k!r}): give the number of spare nodes, an int of 0 or more"
        if k and self.attributes.get("max_restarts"):
            return (f"@torchrun(spares={k}, max_restarts={self.attributes['max_restarts']!r}): a gang with spares "
                    f"starts its ranks from a warm launcher, not torchrun, and replaces a lost node by a spare instead "
                    f"of restarting the workers in place: drop max_restarts (or the spares)")
        n = self.attributes.get("nproc_per_node")
        if not n:
            return None
        from stoker.distributed.accel import nproc_problem, step_request

        problem = nproc_problem(int(n), step_request(resources, options))
        return f"@torchrun(nproc_per_node={n}): {problem}" if problem else None


def helper_for(func: Any, par: Any) -> Any:
    """The `current.torch` of a task of step `func` on gang node `par` (a distributed.torchrun.TorchrunHelper)."""
    # the launcher lives with the rest of the task's process machinery (imported only by such steps)
    from stoker.distributed.torchrun import TorchrunHelper

    own = next((d for d in getattr(func, "decorators", []) if isinstance(d, TorchrunDecorator)), None)
    return TorchrunHelper.from_settings(own.attributes if own else {}, par, resources_request(func),
                                        backend_options(func))


torchrun = make_step_decorator(TorchrunDecorator)
