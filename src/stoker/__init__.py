"""stoker: develop, run and scale LLM training pipelines.

`from stoker import FlowSpec, step, Parameter, current, ...` follows Metaflow's API, so a Metaflow flow that
uses these runs after changing its import line. Nothing here imports torch.
"""

from __future__ import annotations

from typing import Any

from stoker import monitor as _monitor_package  # noqa: F401  (loaded first, so that `stoker.monitor` stays the decorator)
from stoker.backends.aws.decorator import batch  # noqa: E402  (registers @batch for --with batch:...)
from stoker.backends.slurm.decorator import slurm  # noqa: E402  (registers @slurm for --with slurm:...)
from stoker.features import (
    card,
    catch,
    environment,
    monitor,
    neuron_monitor,
    parallel,
    resources,
    retry,
    step,
    timeout,
    torchrun,
)
from stoker.features.exit_hook import exit_hook
from stoker.features.metaflow_only import schedule, trigger, trigger_on_finish
from stoker.features.project import project
from stoker.features.secrets import get_secret, secrets
from stoker.flow import spec as _spec
from stoker.flow.configs import config_expr
from stoker.flow.current import current
from stoker.flow.parameters import Config, IncludeFile, JSONType, Parameter
from stoker.flow.presubmit import presubmit
from stoker.flow.spec import FlowSpec, MergeArtifactsError
from stoker.flow.user_decorators import (
    USER_SKIP_STEP,
    FlowMutator,
    StepMutator,
    UserStepDecorator,
    user_step_decorator,
)

__version__ = "0.1.0"


def _run_cli(flow_cls: type) -> Any:
    from stoker.cli.flow_cli import main_program

    return main_program(flow_cls)


_spec.install_cli(_run_cli)

_CLIENT = {"Flow", "Run", "Step", "Task", "DataArtifact", "Metaflow", "namespace", "get_namespace",
           "default_namespace", "MetaflowNotFound", "MetaflowNamespaceMismatch", "get_metadata", "metadata",
           "default_metadata"}


def __getattr__(name: str) -> Any:
    if name in ("Runner", "NBRunner"):  # the Runner API (stoker.runner), loaded on first use
        from stoker import runner

        return getattr(runner, name)
    # The client is loaded on first use so that `import stoker` in a task stays light.
    if name in _CLIENT:
        from stoker import client

        return getattr(client, name)
    from stoker.features import metaflow_only

    if name in metaflow_only.NAMES:  # Metaflow's names that stoker refuses, with the reason (not an ImportError)
        return metaflow_only.metaflow_only(name)
    raise AttributeError(f"module 'stoker' has no attribute {name!r}")


__all__ = ["FlowSpec", "step", "Parameter", "Config", "IncludeFile", "JSONType", "current", "retry", "catch",
           "timeout", "resources", "environment", "parallel", "torchrun", "monitor", "neuron_monitor", "card", "slurm",
           "batch", "project", "exit_hook", "schedule", "trigger", "trigger_on_finish",
           "secrets", "get_secret", "config_expr", "presubmit", "MergeArtifactsError",
           "UserStepDecorator", "user_step_decorator", "StepMutator", "FlowMutator", "USER_SKIP_STEP", "Runner",
           "NBRunner",
           *sorted(_CLIENT)]
