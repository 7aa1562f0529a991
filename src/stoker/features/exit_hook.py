"""`@exit_hook(on_success=[...], on_error=[...])`: functions called once a run has ended, as Metaflow's.

Each hook is a function of the flow's module (or a dotted `module.function` string) and runs in a new Python
process, after the run's last task, with the run's environment: a hook that takes `run` gets the client's `Run`
of the run that ended (None when it cannot be read). Its output is printed; a hook that fails, or runs longer than
`timeout` seconds (default 600: nothing waits forever), is reported in one line and does not change how the run
ended. A flow may carry several `@exit_hook`s; their hooks run in the order given.

    python -m stoker.features.run_exit_hook FLOW_FILE FUNCTION FLOW/RUN_ID    (what the run calls for each hook)
"""

from __future__ import annotations

import os
import subprocess
import sys

from stoker.errors import ConfigError
from stoker.flow.decorators import FlowDecorator


class ExitHookDecorator(FlowDecorator):
    """Call `on_success` functions when the run succeeded and `on_error` ones when it did not (each a function
    or a `module.function` string), each in a process of its own, after the run ended."""

    name = "exit_hook"
    allow_multiple = True
    defaults = {"on_success": [], "on_error": [], "options": {}, "timeout": 600}

    def validate(self) -> None:
        if not self.attributes["on_success"] and not self.attributes["on_error"]:
            raise ConfigError("@exit_hook needs on_success=[...] or on_error=[...] (a list of functions)")
        for key in ("on_success", "on_error"):
            for fn in self.attributes[key]:
                if not (isinstance(fn, str) or callable(fn)):
                    raise ConfigError(f"@exit_hook({key}=...): {fn!r} is neither a function nor a "
                                      f"'module.function' string")

    def hook_names(self, succeeded: bool) -> list[str]:
        fns = self.attributes["on_success" if succeeded else "on_error"]
        return [fn if isinstance(fn, str) else fn.__name__ for fn in fns]

    def run_finished(self, flow_file: str, pathspec: str, succeeded: bool) -> None:
        for fn in self.hook_names(succeeded):
            _call(flow_file, fn, pathspec, float(self.attributes["timeout"]))


exit_hook = ExitHookDecorator.make()


def _call(flow_file: str, fn: str, pathspec: str, timeout: float) -> None:
    try:
        out = subprocess.run([sys.executable, "-m", "stoker.features.run_exit_hook", flow_file, fn, pathspec],
                             capture_output=True, text=True, timeout=timeout, env=os.environ.copy())
    except subprocess.TimeoutExpired:
        print(f"[exit_hook] hook '{fn}' ran longer than {timeout:g} s and was stopped", flush=True)
        return
    if out.stdout.strip():
        print(out.stdout.strip(), flush=True)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
        print(f"[exit_hook] hook '{fn}' failed: {last}", flush=True)
