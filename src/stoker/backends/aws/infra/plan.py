"""`stoker infra plan`: read what AWS has (by name, ownership by the `stoker:infra` tag and the state file),
compare it with the desired resources, and say what apply would create, update or leave. Changes nothing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stoker.backends.aws.infra.base import Actual, Clients, Context, Resource
from stoker.backends.aws.infra.compute import ComputeEnvironment, JobQueue
from stoker.backends.aws.infra.config import InfraConfig
from stoker.backends.aws.infra.iam import InstanceProfile, InstanceRole, JobRole, ServiceLinkedRole
from stoker.backends.aws.infra.network import (
    LaunchTemplate,
    PlacementGroup,
    SecurityGroup,
    check_default_security_group,
)
from stoker.backends.aws.infra.secret import StoreKeySecret
from stoker.backends.aws.infra.spec import Facts
from stoker.backends.aws.infra.state import State
from stoker.backends.aws.infra.storage import Bucket, Repository
from stoker.backends.aws.session import error_code
from stoker.errors import BackendError, ConfigError

# creation order (each needs only what comes before it); destroy goes backwards
ORDER: list[type[Resource]] = [ServiceLinkedRole, Bucket, StoreKeySecret, Repository, SecurityGroup, InstanceRole,
                               JobRole, InstanceProfile, PlacementGroup, LaunchTemplate, ComputeEnvironment, JobQueue]
SYMBOLS = {"create": "+", "update": "~", "ok": "=", "use": "·", "conflict": "!"}


@dataclass
class Change:
    resource: Resource
    action: str  # create | update | ok (stoker's, as desired) | use (exists, not stoker's) | conflict
    actual: Actual | None = None
    diffs: list[str] = field(default_factory=list)
    note: str = ""


@dataclass
class Plan:
    ctx: Context
    changes: list[Change]

    def of(self, action: str) -> list[Change]:
        return [c for c in self.changes if c.action == action]

    @property
    def changed(self) -> bool:
        return any(c.action in ("create", "update") for c in self.changes)

    def summary(self) -> str:
        if not self.changed and not self.of("conflict"):
            return "no changes"
        parts = [f"{len(self.of(a))} to {a}" for a in ("create", "update") if self.of(a)]
        parts.append(f"{len(self.of('ok')) + len(self.of('use'))} unchanged")
        if self.of("conflict"):
            parts.append(f"{len(self.of('conflict'))} in the way")
        return ", ".join(parts)


def open_context(cfg: InfraConfig, clients: Clients | None = None, report: Callable[[str], None] | None = None,
                 state: State | None = None, **kw: Any) -> Context:
    clients = clients or Clients(cfg.region)
    ctx = Context(cfg=cfg, clients=clients, state=state or State.load(cfg.name),
                  facts=Facts(region=cfg.region or clients.region_name), **kw)
    if report is not None:
        ctx.report = report
    return ctx


def discover(ctx: Context) -> None:
    """The facts every resource needs: account, partition, the subnets' VPC and zone, the AMI."""
    cfg, f = ctx.cfg, ctx.facts
    who = ctx.call("sts", "get_caller_identity", "the caller's identity")
    f.account, f.partition = who["Account"], who["Arn"].split(":")[1]
    try:
        subnets = ctx.call("ec2", "describe_subnets", f"subnets {', '.join(cfg.subnets)}",
                           SubnetIds=list(cfg.subnets))["Subnets"]
    except BackendError as e:
        if e.__cause__ is not None and error_code(e.__cause__).startswith("InvalidSubnet"):
            raise ConfigError(f"subnets = {cfg.subnets}: {e}. List subnets of {f.region} "
                              f"(aws ec2 describe-subnets --region {f.region}) or set region") from None
        raise
    vpcs = sorted({s["VpcId"] for s in subnets})
    if len(vpcs) > 1:
        raise ConfigError(f"subnets = {cfg.subnets} belong to several VPCs ({', '.join(vpcs)}): list subnets "
                          "of one VPC")
    if cfg.vpc and vpcs and cfg.vpc != vpcs[0]:
        raise ConfigError(f"vpc = {cfg.vpc!r} but the subnets are in {vpcs[0]}: fix vpc or leave it out")
    f.vpc = cfg.vpc or (vpcs[0] if vpcs else None)
    zones = sorted({s["AvailabilityZone"] for s in subnets})
    if len(zones) > 1 and cfg.placement_group:
        raise ConfigError(f"subnets = {cfg.subnets} span {', '.join(zones)}, but a cluster placement group "
                          "lives in one Availability Zone: list the subnets of one zone (where your instance "
                          "type has capacity), or set placement_group = false (EFA then loses its low latency)")
    if len(zones) > 1 and cfg.efa_interfaces:
        ctx.warnings.append(f"subnets span {', '.join(zones)}: the nodes of one job may land in different zones, "
                            "where EFA does not reach; list the subnets of one zone")
    if cfg.efa_interfaces > 1 and any(s.get("MapPublicIpOnLaunch") for s in subnets):
        ctx.warnings.append("instances with several network interfaces get no public IP address: nodes in these "
                            "public subnets cannot pull images unless the subnets route through a NAT gateway "
                            "(or have VPC endpoints for ECR, S3 and CloudWatch Logs); prefer private subnets")
    if cfg.spot:  # config.py refuses Spot with a placement group or EFA
        ctx.warnings.append("spot = true: this queue runs single-node jobs only; AWS Batch does not run multi-node "
                            "parallel jobs (num_parallel gangs) on Spot compute environments")
    check_default_security_group(ctx)
    f.ami = resolve_ami(ctx)


def resolve_ami(ctx: Context) -> str:
    source = ctx.cfg.ami_source
    if not source.startswith("ssm:"):
        return source
    path = source[len("ssm:"):]
    got = ctx.call("ssm", "get_parameter", f"SSM parameter {path}", missing=("ParameterNotFound",), Name=path)
    if got is None:
        raise ConfigError(f"ami = {source!r}: no such SSM parameter in {ctx.facts.region}; check the path (aws ssm "
                          f"get-parameter --name {path}) or give an AMI id, ami = \"ami-...\"")
    return got["Parameter"]["Value"]


def decide(ctx: Context, r: Resource) -> Change:
    actual = r.read()
    if actual is None:
        note = "recorded in the state but gone: created again" if ctx.state.created(r.key) else ""
        return Change(r, "create", None, [], note)
    if r.owned(actual):
        diffs = r.diff(actual)
        return Change(r, "update" if diffs else "ok", actual, diffs)
    if r.adoptable:
        return Change(r, "use", actual, [], r.use_note)
    return Change(r, "conflict", actual, [], f"exists without the tag stoker:infra={ctx.cfg.name}: delete it, or "
                  "choose another name in the TOML (name prefixes every resource)")


def make_plan(ctx: Context) -> Plan:
    ctx.cfg.check_creatable()  # before any AWS call
    discover(ctx)
    changes = []
    for cls in ORDER:
        r = cls(ctx)
        if not r.wanted():
            continue
        change = decide(ctx, r)
        r.publish(change.actual if change.action != "create" else None, changing=change.action == "update")
        changes.append(change)
    return Plan(ctx, changes)


def plan(cfg: InfraConfig, clients: Clients | None = None, report: Callable[[str], None] | None = None) -> Plan:
    """What `apply` would do, reading AWS only."""
    return make_plan(open_context(cfg, clients, report))
