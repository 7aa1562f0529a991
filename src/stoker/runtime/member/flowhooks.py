"""What the run and its tasks do before any decorator acts: config values in decorators, and the run's project.

- `bind_run`: when a run starts, config expressions in decorators are evaluated with the run's Config values
  and @project gives the run's project and branch (its system tags).
- In a task started as a new process (`python flow.py _task SPEC`): the same binding. What a task does for a
  decorator is in that decorator's module (stoker.features).
"""

from __future__ import annotations

from typing import Any

from stoker.flow.configs import bind_configs, needs_binding
from stoker.flow.mutables import apply_user_decorators, has_user_decorators
from stoker.flow.parameters import Config
from stoker.flow.project import ProjectInfo, project_info


def bind_run(flow_cls: type, values: dict[str, Any], user: str, project_options: dict[str, Any] | None = None,
             flow_name: str | None = None) -> ProjectInfo | None:
    """Run the flow's mutators (once) and bind the run's Config values into the flow's decorators; return its
    @project info (None without one)."""
    apply_user_decorators(flow_cls, values)
    bind_configs(flow_cls, values)
    opts = project_options or {}
    return project_info(flow_cls, user, branch=opts.get("branch"), production=bool(opts.get("production")),
                        flow_name=flow_name)


def bind_task_configs(flow_cls: type, spec: Any, store: Any = None) -> None:
    """A task in a new process: run the flow's mutators and evaluate config expressions in decorators with its
    run's Config values."""
    mutators = has_user_decorators(flow_cls)
    if not needs_binding(flow_cls) and not mutators:
        return
    from stoker.store.artifacts import load_artifact
    from stoker.store.blobs import open_store

    store = store or open_store(spec.store_url or None)
    inputs = flow_cls._run_inputs()
    values = {k: load_artifact(store, d) for k, d in spec.run_inputs.items()
              if isinstance(inputs.get(k), Config)}
    if mutators:
        apply_user_decorators(flow_cls, values)
    bind_configs(flow_cls, values)


def bind_default_configs(flow_cls: type, base_dir: Any) -> None:
    """Bind the Configs' defaults (what `--dry-run` shows when no run has resolved them)."""
    if not needs_binding(flow_cls):
        return
    values = {attr: p.resolve(None, None, base_dir) for attr, p in flow_cls._run_inputs().items()
              if isinstance(p, Config)}
    bind_configs(flow_cls, values)
