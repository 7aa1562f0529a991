"""stoker.train: a Llama model, tensor parallel + ZeRO-1/FSDP2, a trainer with committed checkpoints.

    from stoker.train import run_training
    result = run_training({"data": {"url": "tokens.bin"}, "model": {"name": "tiny"}, "train": {"steps": 100}})

or ``torchrun --nproc-per-node 2 -m stoker.train --config run.toml --set parallel.tp=2``.
Importing this package does not import torch; the names below load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Llama": "stoker.train.model", "LlamaConfig": "stoker.train.settings",
    "get_model_config": "stoker.train.settings", "MODEL_CONFIGS": "stoker.train.settings",
    "ParallelDims": "stoker.train.parallel", "ParallelConfig": "stoker.train.settings",
    "parallelize": "stoker.train.parallel",
    "TrainConfig": "stoker.train.settings", "load_config": "stoker.train.config",
    "run_training": "stoker.train.trainer", "Trainer": "stoker.train.trainer",
    "Checkpointer": "stoker.train.checkpoint",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'stoker.train' has no attribute {name!r}")
