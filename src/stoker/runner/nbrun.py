"""`NBRunner(FlowClass)`: run a flow defined in a notebook cell, as Metaflow's NBRunner (2.19) does.

The cell that defines the flow (IPython's input history: the cell being run) is written to a temporary
`<FlowName>*.py` file in `base_dir`, cut after the FlowSpec class and ended with `if __name__ == '__main__':
FlowName()`; a Runner runs that file. `nbrun()`/`nbresume()` wait, clean up and return the client Run.
"""

from __future__ import annotations

import ast
import os
import tempfile
from typing import Any

from stoker.runner.runner import ExecutingRun, Runner


class NBRunnerInitializationError(Exception):
    """NBRunner was created outside an interactive Python (IPython, Jupyter)."""


def get_current_cell(ipython: Any) -> str | None:
    """The source of the cell being run (the last entry of IPython's raw input history)."""
    return ipython.history_manager.input_hist_raw[-1] if ipython else None


def format_flowfile(cell: str) -> str:
    """The cell as a flow file: everything up to the end of its first FlowSpec class, then the main guard."""
    flows = [n for n in ast.parse(cell).body if isinstance(n, ast.ClassDef)
             and any(getattr(b, "id", getattr(b, "attr", None)) == "FlowSpec" for b in n.bases)]
    if not flows:
        raise ModuleNotFoundError("The cell doesn't contain any class that inherits from 'FlowSpec'")
    lines = cell.splitlines()[: flows[0].end_lineno]
    lines += ["if __name__ == '__main__':", f"    {flows[0].name}()"]
    return "\n".join(lines)


class NBRunner:
    """`NBRunner(FlowClass, show_output=True, profile=None, env=None, base_dir=None, file_read_timeout=3600,
    **top_level_options)`, created in the cell that defines the flow: `nbrun(**params)` returns the finished
    client Run; `run`/`resume`/`async_run`/`async_resume` are the Runner's; call `cleanup()` after the async ones."""

    def __init__(self, flow: type, show_output: bool = True, profile: str | None = None,
                 env: dict[str, str] | None = None, base_dir: str | None = None, file_read_timeout: int = 3600,
                 **kwargs: Any) -> None:
        try:
            from IPython import get_ipython
        except ModuleNotFoundError:
            raise NBRunnerInitializationError(
                "'NBRunner' requires an interactive Python environment (such as Jupyter)") from None
        self.cell = get_current_cell(get_ipython())
        self.flow = flow
        self.show_output = show_output
        self.env_vars = os.environ.copy()
        self.env_vars.update(env or {})
        self.env_vars.update({"JPY_PARENT_PID": ""})  # the flow process must not talk to the notebook server
        if profile:
            self.env_vars["METAFLOW_PROFILE"] = profile
        self.base_dir = base_dir if base_dir is not None else os.getcwd()
        self.file_read_timeout = file_read_timeout
        if not self.cell:
            raise ValueError("Couldn't find a cell.")
        self.tmp_flow_file = tempfile.NamedTemporaryFile(prefix=flow.__name__, suffix=".py", mode="w",
                                                         dir=self.base_dir, delete=False)
        self.tmp_flow_file.write(format_flowfile(self.cell))
        self.tmp_flow_file.flush()
        self.tmp_flow_file.close()
        self.runner = Runner(flow_file=self.tmp_flow_file.name, show_output=show_output, profile=profile,
                             env=self.env_vars, cwd=self.base_dir, file_read_timeout=file_read_timeout, **kwargs)

    def nbrun(self, **kwargs: Any) -> Any:
        """Run the flow, wait, clean up; returns the client Run."""
        result = self.runner.run(**kwargs)
        self.cleanup()
        return result.run

    def nbresume(self, **kwargs: Any) -> Any:
        """Resume, wait, clean up; returns the client Run."""
        result = self.runner.resume(**kwargs)
        self.cleanup()
        return result.run

    def run(self, **kwargs: Any) -> ExecutingRun:
        """Runner.run on the cell's flow."""
        return self.runner.run(**kwargs)

    def resume(self, **kwargs: Any) -> ExecutingRun:
        """Runner.resume on the cell's flow."""
        return self.runner.resume(**kwargs)

    async def async_run(self, **kwargs: Any) -> ExecutingRun:
        """Runner.async_run on the cell's flow."""
        return await self.runner.async_run(**kwargs)

    async def async_resume(self, **kwargs: Any) -> ExecutingRun:
        """Runner.async_resume on the cell's flow."""
        return await self.runner.async_resume(**kwargs)

    def cleanup(self) -> None:
        """Delete the temporary flow file and logs (nbrun/nbresume do it themselves)."""
        if os.path.exists(self.tmp_flow_file.name):
            os.remove(self.tmp_flow_file.name)
        self.runner.cleanup()
