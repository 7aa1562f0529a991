"""The local backend: members are processes on this machine."""

from stoker.backends.local.backend import LocalBackend

__all__ = ["LocalBackend"]
