"""The local backend: members are processes on this machine."""

from .backend import LocalBackend

__all__ = ["LocalBackend"]
