"""Runs one `@exit_hook` function in a process of its own (stoker.features.exit_hook starts it once the run ended):
the function of the flow's module, or a `module.function`, called with `run=` (the client's Run) when it takes it.

    python -m stoker.features.run_exit_hook FLOW_FILE FUNCTION FLOW/RUN_ID
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from typing import Any


def _load(flow_file: str, fn: str) -> Any:
    module_name, _, function = fn.rpartition(".")
    if module_name:
        try:
            return getattr(importlib.import_module(module_name), function)
        except (ImportError, AttributeError):
            pass
    name = os.path.splitext(os.path.basename(flow_file))[0]
    spec = importlib.util.spec_from_file_location(name, flow_file)
    if spec is None or spec.loader is None:
        raise SystemExit(f"[exit_hook] error: cannot load {flow_file}")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(flow_file)))
    spec.loader.exec_module(module)
    if not hasattr(module, fn):
        raise SystemExit(f"[exit_hook] error: no function '{fn}' in {flow_file}, and no module.function of that name")
    return getattr(module, fn)


def main(argv: list[str]) -> None:
    flow_file, fn, pathspec = argv
    hook = _load(flow_file, fn)
    params = inspect.signature(hook).parameters
    if "run" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        from stoker.client import Run, namespace

        namespace(None)
        try:
            run = Run(pathspec)
        except Exception as e:  # the hook still runs, as Metaflow's does, with run=None
            print(f"[exit_hook] cannot read run {pathspec}: {e}", file=sys.stderr)
            run = None
        hook(run=run)
    else:
        hook()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit("error: python -m stoker.features.run_exit_hook FLOW_FILE FUNCTION FLOW/RUN_ID (the run calls "
                         "it for each @exit_hook function)")
    main(sys.argv[1:])
