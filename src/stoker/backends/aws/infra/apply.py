"""`stoker infra apply | destroy | status`.

apply: plan, refuse before any change if something is in the way, then create what is missing and update what
differs, in dependency order. Each resource is recorded in the state the moment AWS creates it, so a failure
half-way leaves nothing untracked (`destroy` removes it, a second `apply` carries on).

destroy: first the job queue's jobs that have not ended (deleting a queue terminates every job in it): with any,
destroy refuses before changing anything, naming them, unless `terminate_jobs` (then it terminates them). Then
only what is stoker's (`Resource.owned`: tagged `stoker:infra=<name>`, or recorded as created by stoker
and carrying no other infra's tag), newest first: job queue (disable, wait, delete), compute environment (disable,
wait until settled, delete, wait until gone), launch template, placement group, instance profile, roles, security
group, ECR repository (`force` deletes its images), and the bucket and the secret holding the store's signing
key only with `delete_bucket` (the secret recoverable for 7 days unless `force`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stoker.backends.aws.infra.base import Clients, Context
from stoker.backends.aws.infra.compute import JobQueue
from stoker.backends.aws.infra.config import LOG_GROUP, InfraConfig, from_dict
from stoker.backends.aws.infra.plan import ORDER, Plan, make_plan, open_context
from stoker.backends.aws.infra.secret import link_store_key
from stoker.backends.aws.infra.state import State, default_name, pushed_image
from stoker.errors import BackendError, ConfigError, StokerError


@dataclass
class Result:
    plan: Plan | None = None
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    outputs: dict[str, Any] | None = None


def outputs(ctx: Context) -> dict[str, Any]:
    """What the Batch backend and the docs read back (`state.load_outputs`)."""
    cfg, f, n = ctx.cfg, ctx.facts, ctx.names
    return {"region": f.region, "queue": n["job_queue"], "job_role_arn": f.job_role_arn,
            "execution_role_arn": None,  # Batch on EC2 pulls images and sends logs with the instance role
            # the digest `stoker image build --push` recorded, never `:latest`: a tag moves between nodes' pulls
            "image": pushed_image(ctx.state, f.ecr_uri), "ecr_repository_uri": f.ecr_uri, "bucket": cfg.bucket,
            "store_url": cfg.store_url, "log_group": LOG_GROUP, "instance_types": list(cfg.instance_types),
            "compute_environment": n["compute_environment"],
            "placement_group": n["placement_group"] if cfg.placement_group else None,
            "launch_template": n["launch_template"], "store_key_secret_arn": f.store_key_secret_arn}


def apply(cfg: InfraConfig, clients: Clients | None = None, report: Callable[[str], None] | None = None,
          timeout: float = 900.0, plan_report: Callable[[Plan], None] | None = None) -> Result:
    """Make AWS match `cfg`. A second call with the same config makes no create or update call."""
    ctx = open_context(cfg, clients, report, timeout=timeout)
    the_plan = make_plan(ctx)
    if plan_report:
        plan_report(the_plan)
    conflicts = the_plan.of("conflict")
    if conflicts:
        raise ConfigError("nothing was changed: " + "; ".join(f"{c.resource.label} {c.note}" for c in conflicts))
    state = ctx.state
    state.data.update(region=ctx.facts.region, config=cfg.to_dict())
    result = Result(plan=the_plan)
    try:
        for change in the_plan.changes:
            r, actual = change.resource, change.actual
            if change.action == "create":
                ctx.report(f"+ creating {r.label}")
                actual = r.create()
                r.record(actual, created=True)
                result.created.append(r.label)
            elif change.action == "update" and actual is not None:
                diffs = r.diff(actual)  # again: ids created above replace the plan's placeholders
                if diffs:
                    ctx.report(f"~ updating {r.label}: {'; '.join(diffs)}")
                    actual = r.update(actual, diffs)
                    result.updated.append(r.label)
                r.record(actual, created=True)
            elif actual is not None:  # ok / use
                r.record(actual, created=change.action == "ok")
            r.publish(actual)
    except StokerError as e:
        made = [c.resource.label for c in the_plan.changes if c.action == "create"
                and state.created(c.resource.key)]  # Batch's service-linked role is never stoker's
        raise BackendError(
            f"{e}\nstoker infra apply stopped. "
            + (f"Created so far, recorded in {state.path}: {', '.join(made)}. " if made else "Nothing was created. ")
            + "Fix the cause and run `stoker infra apply` again (it carries on), or `stoker infra destroy`."
        ) from e
    result.outputs = outputs(ctx)
    state.data["outputs"] = result.outputs
    state.save()
    link_store_key(ctx)
    if not the_plan.changed:
        ctx.report("no changes: the infrastructure matches the config")
    return result


def context_for(cfg: InfraConfig | None, name: str | None, clients: Clients | None,
                report: Callable[[str], None] | None, **kw: Any) -> Context:
    """A context from the config, or from the state file of `name` (its recorded config)."""
    if cfg is None:
        name = name or default_name()
        state = State.load(name)
        if not state.exists or not state.data.get("config"):
            raise ConfigError(f"no state for infra {name!r} ({state.path}): pass --config with the TOML it was "
                              "applied from")
        cfg = from_dict(state.data["config"], source=str(state.path))
        if state.data.get("region"):
            cfg.region = state.data["region"]
        return open_context(cfg, clients, report, state=state, **kw)
    return open_context(cfg, clients, report, **kw)


def live_jobs_check(ctx: Context, terminate_jobs: bool) -> None:
    """Refuse (nothing changed) while stoker's job queue holds jobs that have not ended, naming them and how to
    stop them; with `terminate_jobs`, terminate them."""
    queue = JobQueue(ctx)
    actual = queue.read()
    if actual is None or not queue.owned(actual):
        return  # no queue, or not stoker's: destroy leaves it and its jobs alone
    jobs = queue.live_jobs()
    if not jobs:
        return
    shown = "; ".join(f"{j['jobId']} ({j['jobName']}, {j['status']})" for j in jobs[:10])
    shown += f"; and {len(jobs) - 10} more" if len(jobs) > 10 else ""
    if terminate_jobs:
        ctx.report(f"- terminating {len(jobs)} jobs of {queue.label}: {shown}")
        queue.terminate(jobs)
        return
    runs = sorted({f"{j['tags']['stoker:flow']}/{j['tags']['stoker:run']}" for j in jobs
                   if j["tags"].get("stoker:flow") and j["tags"].get("stoker:run")})
    stop = [f"`stoker kill {r}`" for r in runs]
    if any(not (j["tags"].get("stoker:flow") and j["tags"].get("stoker:run")) for j in jobs):
        stop.append("`aws batch terminate-job --job-id ID --reason ...` for jobs stoker did not submit")
    raise ConfigError(
        f"{queue.label} holds {len(jobs)} job{'s' if len(jobs) != 1 else ''} that have not ended, and deleting "
        f"the queue terminates every job in it: {shown}. Nothing was changed. Fix: stop them ({', '.join(stop)}) "
        "or wait until they end, then run `stoker infra destroy` again; or `stoker infra destroy "
        "--terminate-jobs` terminates them and destroys the rest")


def destroy(cfg: InfraConfig | None = None, *, name: str | None = None, clients: Clients | None = None,
            delete_bucket: bool = False, force: bool = False, terminate_jobs: bool = False,
            report: Callable[[str], None] | None = None, timeout: float = 900.0) -> Result:
    """Delete what stoker created for this infra, in dependency order, waiting where AWS must. Refuses, changing
    nothing, while the job queue holds jobs that have not ended, unless `terminate_jobs`."""
    ctx = context_for(cfg, name, clients, report, timeout=timeout)
    state, result = ctx.state, Result()
    live_jobs_check(ctx, terminate_jobs)
    try:
        for cls in reversed(ORDER):
            r = cls(ctx)
            if r.keep_on_destroy:
                state.forget(r.key)
                continue
            if not r.wanted() and not state.get(r.key):
                continue  # e.g. placement_group = false, and none was recorded
            actual = r.read()
            if actual is None:
                if state.get(r.key):
                    ctx.report(f"  {r.label}: already gone")
                state.forget(r.key)
                continue
            if not r.owned(actual):
                if state.get(r.key) or r.wanted():
                    ctx.report(f"  left {r.label}: not created by stoker")
                state.forget(r.key)
                continue
            if r.key in ("bucket", "store_key_secret") and not delete_bucket:
                result.kept.append(r.label)
                what = "the store" if r.key == "bucket" else "the key the store's runs are signed with"
                ctx.report(f"  kept {r.label}: it holds {what}; `stoker infra destroy --delete-bucket` deletes "
                           "the bucket, every object in it and the key")
                continue
            ctx.report(f"- deleting {r.label}")
            r.delete(actual, force=force)
            state.forget(r.key)
            result.deleted.append(r.label)
    except StokerError as e:
        raise BackendError(f"{e}\nstoker infra destroy stopped; deleted so far: {', '.join(result.deleted) or 'none'}"
                           f". What is left is still recorded in {state.path}: fix the cause and run "
                           "`stoker infra destroy` again") from e
    state.data["outputs"] = None
    if state.resources:
        state.save()
    else:
        state.remove()
    return result


@dataclass
class Row:
    kind: str
    name: str
    owner: str  # "stoker" | "existing" | "missing"
    detail: str


def status(cfg: InfraConfig | None = None, *, name: str | None = None, clients: Clients | None = None
           ) -> tuple[list[Row], dict[str, Any] | None]:
    """Each resource as AWS has it now, and the recorded outputs."""
    ctx = context_for(cfg, name, clients, None)
    rows = []
    for cls in ORDER:
        r = cls(ctx)
        if not r.wanted() and not ctx.state.get(r.key):
            continue
        actual = r.read()
        if actual is None:
            rows.append(Row(r.kind, r.name, "missing", "-"))
            continue
        owner = "stoker" if r.owned(actual) else "existing"
        r.publish(actual)
        rows.append(Row(r.kind, r.name, owner, r.describe(actual)))
    return rows, ctx.state.data.get("outputs")
