"""Units and job records: what the scheduler submits, and where a run keeps track of its submissions."""

from __future__ import annotations

import os

from stoker.features.hooks import backend_options, deadline, resources_request
from stoker.runtime.contract import Backend, JobRef, Unit
from stoker.runtime.driver.resources import KEYS
from stoker.runtime.spec import TaskSpec
from stoker.store.manifest import run_prefix


def build_unit(flow_cls: type, backend: Backend, kind: str, specs: list[TaskSpec], store_url: str,
               throttle: int | None = None) -> Unit:
    """A unit of `specs` (one step) with the step's settings: its backend decorator's, the resources a node
    asks for and the limit on one attempt (the decorators' hooks)."""
    first = specs[0]
    func = getattr(flow_cls, first.step)
    limit = deadline(func)
    return Unit(kind=kind, flow=first.flow, run_id=first.run_id, step=first.step, specs=specs,
                options=backend_options(func, backend.name), resources=resources_request(func),
                timeout_s=limit[0] if limit else None, store_url=store_url,
                env={"STOKER_RUN_ID": first.run_id, **run_env()}, throttle=throttle)


def node_need(flow_cls: type, step: str) -> dict[str, float]:
    """What one task of `step` takes of this machine's capacity: the explicit requests it counts."""
    want = resources_request(getattr(flow_cls, step))
    return {k: float(want[k]) for k in KEYS if want.get(k)}


# how a run was started (`run --smoke`, `--no-preflight`) and the preflight's floors: every task of the run reads
# them, wherever it runs (a Batch container gets only what its SubmitJob request carries)
RUN_ENV = ("STOKER_SMOKE", "STOKER_PREFLIGHT", "STOKER_PREFLIGHT_MIN_BUSBW_GBPS", "STOKER_PREFLIGHT_MIN_DISK_GB",
           "STOKER_PREFLIGHT_TIMEOUT")


def run_env() -> dict[str, str]:
    return {k: os.environ[k] for k in RUN_ENV if os.environ.get(k)}


def jobs_prefix(flow: str, run_id: str) -> str:
    """The folder of a run's JobRefs (`stoker kill` and a crashed run's guardian read them)."""
    return f"{run_prefix(flow, run_id)}jobs/"


def job_record_name(flow: str, run_id: str, ref: JobRef) -> str:
    """Where a submission's JobRef is kept."""
    return f"{jobs_prefix(flow, run_id)}{ref.backend}-{ref.job_id}.json"


def kill_request_name(flow: str, run_id: str) -> str:
    """Written by `stoker kill`: the run stops its jobs and retries none (wherever `run` and `kill` run)."""
    return f"{run_prefix(flow, run_id)}kill-requested"
