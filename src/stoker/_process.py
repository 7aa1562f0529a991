"""Process-tree helpers shared by the runtime and the backends."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to signal this process when its parent dies (no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
        except OSError:
            pass


def signal_tree(pid: int, sig: int, tree: bool = True) -> None:
    """Signal a task's process group and (tree=True) every descendant: torchrun workers may start sessions
    of their own. After the task process has exited only its group is left to signal."""
    kids: list = []
    if tree:
        import psutil

        try:
            kids = psutil.Process(pid).children(recursive=True)
        except Exception:  # noqa: BLE001 - psutil.Error: already gone
            pass
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for k in kids:
        try:
            k.send_signal(sig)
        except Exception:  # noqa: BLE001 - psutil.Error: already gone
            pass
