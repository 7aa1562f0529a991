"""The local backend: every task is its own process on this machine."""

from .executor import LocalExecutor

__all__ = ["LocalExecutor"]
