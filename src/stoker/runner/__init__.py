"""The Runner API: run flows from Python and notebooks, as Metaflow's `Runner` and `NBRunner` (2.19) do.

See docs/concepts.md ("Running flows from Python"). Importing this package imports no torch.
"""

from stoker.runner.nbrun import NBRunner, NBRunnerInitializationError
from stoker.runner.runner import ExecutingProcess, ExecutingRun, Runner

__all__ = ["Runner", "NBRunner", "NBRunnerInitializationError", "ExecutingRun", "ExecutingProcess"]
