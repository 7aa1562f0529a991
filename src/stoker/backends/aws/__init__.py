"""AWS: the Batch backend (`@batch` steps as Batch jobs, a gang as one multi-node job), `stoker infra` and
`stoker image`.

    decorator.py  @batch and its validation (import-light: `stoker` imports it)
    instances.py  instance types: vCPUs, ECS memory, GPUs, NeuronCores, EFA interfaces, prices
    session.py    boto3 clients and AWS error messages
    render.py     job definitions and SubmitJob requests, pure (what --dry-run prints, golden tests compare)
    client.py     the Batch + CloudWatch Logs calls (injectable)
    states.py     Batch job states -> JobStatus
    backend.py    BatchBackend, the executor contract
    infra/        `stoker infra plan | apply | destroy | status`
    image.py      `stoker image`: Dockerfiles for the step's image, docker build + push to ECR
    cost.py       node-hours and estimated cost of a run

Only the decorator is imported eagerly; the rest loads on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from stoker.backends.aws.decorator import BatchDecorator, batch

_LAZY = {"BatchBackend": "backend", "BatchOptions": "render"}
__all__ = ["BatchBackend", "BatchDecorator", "BatchOptions", "batch"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
