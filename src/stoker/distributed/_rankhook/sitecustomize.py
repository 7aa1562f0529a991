"""Loaded by every Python process started under a task with this folder on PYTHONPATH (torchrun, its ranks, a warm
launcher): installs the stack hook (stackhook.py), then runs the environment's own `sitecustomize`, if any, which
this one shadows. Never fails a process: the hook is best effort."""

import importlib.machinery
import importlib.util
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
try:  # the environment's own sitecustomize
    _spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
    if _spec is not None and _spec.loader is not None:
        _theirs = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(_theirs)
except Exception as e:  # noqa: BLE001 - as Python reports a failing sitecustomize, and goes on
    print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(e).__name__}: {e}", file=sys.stderr)
