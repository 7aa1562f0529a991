"""Metaflow names that stoker does not implement, importable so that a flow using them fails as a user expects.

- `@schedule`, `@trigger`, `@trigger_on_finish`: flow decorators that take effect only where a flow is deployed to
  an event-driven scheduler (Argo, Step Functions, Airflow). `python flow.py run` ignores them on Metaflow and on
  stoker alike; their arguments are checked and kept (`flow_decorators` of the class).
- `@kubernetes`, `@conda`, `@pypi`, `@conda_base`, `@pypi_base`, `@checkpoint`, `@model`: placing one is
  allowed, and the flow's static check (`run`, `check`) then refuses it in one line with the reason and what to use
  instead (docs/from-metaflow.md), not an ImportError from the import line.
- `S3`, `parallel_map`, `parallel_imap_unordered`: calling one raises a `ConfigError` that says what to use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stoker.errors import ConfigError
from stoker.flow.decorators import FlowDecorator

_ENVIRONMENTS = ("per-step Python environments are not supported yet: install the packages into the environment "
                 "stoker runs in (pip install ...), or into the image of a @batch step (stoker image build)")
_WHY = {
    "kubernetes": "stoker runs steps on this machine, on Slurm (@slurm) and on AWS Batch (@batch), not on "
                  "Kubernetes: use @slurm(...) or @batch(...)",
    "conda": _ENVIRONMENTS,
    "pypi": _ENVIRONMENTS,
    "conda_base": _ENVIRONMENTS,
    "pypi_base": _ENVIRONMENTS,
    "checkpoint": "@checkpoint is Metaflow's checkpoint extension: stoker.train commits and resumes checkpoints "
                  "itself (docs/training.md); in your own code, save to current.checkpoint_dir",
    "model": "@model is Metaflow's checkpoint extension: save the model as an artifact, or export it with "
             "stoker.train (docs/training.md)",
}
_CALLABLES = {
    "S3": "Metaflow's S3 client is not part of stoker: use boto3 (or s3fs) directly, or store data as artifacts "
          "(STOKER_STORE=s3://... keeps them in S3)",
    "parallel_map": "parallel_map is not part of stoker: use a foreach (self.next(self.step, foreach=...)) or "
                    "concurrent.futures in the step",
    "parallel_imap_unordered": "parallel_imap_unordered is not part of stoker: use a foreach or "
                               "concurrent.futures in the step",
}
NAMES = (*_WHY, *_CALLABLES)


class _DeployOnly(FlowDecorator):
    """Takes effect where a flow is deployed to an event-driven scheduler; `run` ignores it, as Metaflow's does."""


class ScheduleDecorator(_DeployOnly):
    """`@schedule(hourly=, daily=, weekly=, cron=, timezone=)`: when a deployed flow runs; ignored by `run`."""

    name = "schedule"
    defaults = {"cron": None, "weekly": False, "daily": True, "hourly": False, "timezone": None}


class TriggerDecorator(_DeployOnly):
    """`@trigger(event=, events=, options=)`: the events that start a deployed flow; ignored by `run`."""

    name = "trigger"
    defaults = {"event": None, "events": [], "options": {}}


class TriggerOnFinishDecorator(_DeployOnly):
    """`@trigger_on_finish(flow=, flows=, options=)`: start a deployed flow when another finishes; ignored by
    `run`."""

    name = "trigger_on_finish"
    defaults = {"flow": None, "flows": [], "options": {}}


schedule = ScheduleDecorator.make()
trigger = TriggerDecorator.make()
trigger_on_finish = TriggerOnFinishDecorator.make()


def _refusal(name: str) -> Callable:
    message = f"@{name} is Metaflow's, not stoker's: {_WHY[name]} (docs/from-metaflow.md)"

    def attach(target: Any) -> Any:
        holder = target
        if isinstance(target, type):  # a flow decorator: the flow's start step carries the refusal
            holder = getattr(target, "start", None)
            if holder is None or not getattr(holder, "is_step", False):
                raise ConfigError(message)
        errors = holder.__dict__.setdefault("decorator_errors", [])
        if message not in errors:
            errors.append(message)  # the flow's static check reports it (file:line), before anything runs
        return target

    def decorator(f: Any = None, **_attributes: Any) -> Any:
        return attach(f) if f is not None and callable(f) else attach

    decorator.__name__ = name
    return decorator


def _unavailable(name: str) -> Callable:
    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise ConfigError(f"{name}: {_CALLABLES[name]} (docs/from-metaflow.md)")

    refuse.__name__ = name
    return refuse


def metaflow_only(name: str) -> Any:
    """What `from stoker import NAME` gives for a Metaflow name stoker refuses (see the module docstring)."""
    return _refusal(name) if name in _WHY else _unavailable(name)
