"""Named model shapes: ``get_model_config("llama2-7b")`` and friends.

Kept so that ``from stoker.train.configs import get_model_config`` goes on working: the shapes, like every other
setting, are defined in the torch-free :mod:`stoker.train.settings` (import them from there, or from
``stoker.train``)."""

from __future__ import annotations

from stoker.train.settings import MODEL_CONFIGS, LlamaConfig, get_model_config, with_overrides

__all__ = ["MODEL_CONFIGS", "LlamaConfig", "get_model_config", "with_overrides"]
