"""Flows that ship with stoker (the quickstart pipeline); examples/ re-exports them."""

from __future__ import annotations

from pathlib import Path


def quickstart_path() -> Path:
    """The flow file `stoker quickstart` runs."""
    return Path(__file__).with_name("llama_pretrain.py")
