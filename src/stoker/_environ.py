"""A copy of the environment that is made again only when it changed."""

from __future__ import annotations

import os

_ENVIRON: list = [None, {}]  # os.environ's raw data when last copied, and the copy


def environ_copy() -> dict[str, str]:
    """``dict(os.environ)``, made again only when the environment changed: a wide foreach asks for it per task.
    The same dict comes back while nothing changes, so it must not be modified (``is`` tells a change)."""
    data = getattr(os.environ, "_data", None)
    if data is None:
        return dict(os.environ)
    if _ENVIRON[0] != data:  # a C-level compare of the raw entries
        _ENVIRON[0], _ENVIRON[1] = dict(data), dict(os.environ)
    return _ENVIRON[1]
