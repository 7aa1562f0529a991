"""`@resources(cpu=, memory=, gpu=, trainium=, ...)`: what one node of the step needs.

Locally the explicit requests bound how many tasks run at once (runtime/driver/resources.py); a remote backend asks
its engine for them (`resources_request`, the unit's `resources`); @torchrun derives processes per node from them.
"""

from __future__ import annotations

from typing import Any

from stoker.flow.decorators import StepDecorator, make_step_decorator


class ResourcesDecorator(StepDecorator):
    """Per-node resources. Locally they bound concurrency; remote backends request them."""

    name = "resources"
    defaults = {"cpu": None, "memory": None, "gpu": None, "trainium": None, "inferentia": None,
                "efa": None, "shared_memory": None, "disk": None}

    def validate(self) -> None:
        for k, v in self.attributes.items():
            if v is not None:
                self._number(k, kind=float)

    def resources_request(self) -> dict[str, Any]:
        return {k: v for k, v in self.attributes.items() if v is not None}


resources = make_step_decorator(ResourcesDecorator)
