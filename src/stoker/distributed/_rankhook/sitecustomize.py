"""Loaded by every Python process started under a task with this folder on PYTHONPATH (torchrun, its ranks, a warm
launcher): installs the stack hook (stackhook.py), then hands over to the environment's own `sitecustomize`, if any.
Never fails a process: the hook is best effort."""

import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
try:
    if os.environ.get("STOKER_STACKS_DIR"):
        sys.path.insert(0, _here)
        import stackhook

        stackhook.install()
except Exception:  # noqa: BLE001, S110 - a hook must never stop a rank from starting
    pass
finally:
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    sys.modules.pop("sitecustomize", None)
    try:  # the environment's own sitecustomize, which this one shadowed
        import sitecustomize  # noqa: F401
    except ImportError:
        pass
