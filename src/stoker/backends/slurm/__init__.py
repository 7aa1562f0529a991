"""The Slurm backend: `@slurm(...)` steps run as sbatch jobs (a gang is one `--nodes=N` job).

    decorator.py  @slurm and its validation (import-light: `stoker` imports it)
    render.py     sbatch scripts, pure (what --dry-run prints and golden tests compare)
    client.py     the sbatch / sacct / scontrol / scancel / sinfo runner (injectable)
    states.py     Slurm states and exit codes -> JobStatus
    backend.py    SlurmBackend, the executor contract

Only the decorator is imported eagerly; the rest loads on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from stoker.backends.slurm.decorator import SlurmDecorator, slurm

_LAZY = {"SlurmBackend": "backend", "SlurmClient": "client", "SlurmOptions": "render", "render_sbatch": "render"}
__all__ = ["SlurmBackend", "SlurmClient", "SlurmDecorator", "SlurmOptions", "render_sbatch", "slurm"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
