"""`@torchrun(nproc_per_node=None, ...)`: a gang step whose nodes launch torchrun.

In the step, `current.torch.run(entrypoint="pkg.module", args={...})` starts torchrun with the gang's
`--nnodes/--node_rank/--master_addr/--master_port` (distributed/torchrun.py does the launching).
"""

from __future__ import annotations

from stoker.flow.current import current
from stoker.flow.decorators import ParallelDecorator, TaskContext, make_step_decorator


class TorchrunDecorator(ParallelDecorator):
    """A gang step whose nodes launch torchrun: `current.torch.run(entrypoint, args)` in the step."""

    name = "torchrun"
    defaults = {"nproc_per_node": None, "master_port": None, "all_nodes_started_timeout": 600,
                "rdzv_timeout": None, "max_restarts": 0, "tee": True,
                # Neuron: the compile cache's prefix in the store (None: not kept), and a neuron_parallel_compile
                # pass before the run (True, or a dict of flags to change for it, e.g. {"steps_this_run": 2})
                "neuron_cache": "neuron-cache/", "precompile": False,
                # flags of the command whose store URLs are copied to each node's disk first (["data_dir"])
                "stage": None}
    order = 6  # after @environment: the launcher's environment has its variables

    def task_started(self, ctx: TaskContext) -> None:
        # the launcher lives with the rest of the task's process machinery (it is imported only by such steps)
        from stoker.distributed.torchrun import TorchrunHelper

        current._set(torch=TorchrunHelper.for_task(ctx.func, ctx.parallel))


torchrun = make_step_decorator(TorchrunDecorator)
