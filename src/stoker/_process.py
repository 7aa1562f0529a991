"""Process-tree helpers shared by the runtime and the backends."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

import psutil

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to signal this process when its parent dies (no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
        except OSError:
            pass


def signal_tree(pid: int, sig: int) -> None:
    """Signal a task's process group and every descendant (torchrun workers may start sessions of their own)."""
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        kids = []
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for k in kids:
        try:
            k.send_signal(sig)
        except psutil.Error:
            pass
