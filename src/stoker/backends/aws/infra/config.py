"""The infra TOML (`stoker infra ... --config infra.toml`, default `./stoker-infra.toml`) as a validated dataclass.

Everything that can be checked without calling AWS is checked here, so a bad file fails before any call is made;
what needs AWS (subnets exist, one Availability Zone, the AMI parameter resolves) is checked by the plan.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from stoker.backends.aws.instances import InstanceType, instance_type, known_names
from stoker.errors import ConfigError

DEFAULT_CONFIG = "stoker-infra.toml"
LOG_GROUP = "/aws/batch/job"  # where Batch sends every job's container output
SSM_AMI = {  # the ECS-optimized Amazon Linux 2023 AMIs, by what the instance types need
    "cpu": "ssm:/aws/service/ecs/optimized-ami/amazon-linux-2023/recommended/image_id",
    "neuron": "ssm:/aws/service/ecs/optimized-ami/amazon-linux-2023/neuron/recommended/image_id",
    "gpu": "ssm:/aws/service/ecs/optimized-ami/amazon-linux-2023/gpu/recommended/image_id",
}
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,30}[A-Za-z0-9]")  # fits every derived name (IAM: 64 chars)
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_ECR = re.compile(r"(?:[a-z0-9]+(?:[._-][a-z0-9]+)*/)*[a-z0-9]+(?:[._-][a-z0-9]+)*")
_IDS = {"subnets": "subnet-", "security_group": "sg-", "vpc": "vpc-"}


@dataclass(kw_only=True)
class InfraConfig:
    """What `stoker infra` creates. `name` prefixes every resource and keys the state file."""

    name: str = "stoker"
    region: str | None = None  # default: $STOKER_AWS_REGION, $AWS_REGION, the profile's region
    subnets: list[str] = field(default_factory=list)
    security_group: str | None = None  # None: create one, self-referencing all traffic (EFA needs it)
    vpc: str | None = None  # only to create the security group; default: the first subnet's VPC
    instance_types: list[str] = field(default_factory=lambda: ["trn1.32xlarge"])
    max_vcpus: int = 512
    min_vcpus: int = 0
    bucket: str = ""
    prefix: str = "stoker"
    bucket_versioning: bool = False
    ecr_repository: str = "stoker"
    ami: str = ""  # "ssm:/parameter/path" or "ami-..."; default: the ECS-optimized AL2023 AMI for the types
    root_volume_gb: int = 500
    spot: bool = False
    placement_group: bool = True
    efa: bool = True  # one EFA interface per network card where the instance type has EFA
    install_drivers: bool = True  # user data installs the EFA / Neuron drivers where the AMI lacks them
    job_role_policy_arns: list[str] = field(default_factory=list)  # extra managed policies for the job role
    tags: dict[str, str] = field(default_factory=dict)  # extra tags on every resource
    source: str = ""  # the file it came from (messages only)

    def __post_init__(self) -> None:
        # long on purpose: one independent check per setting, each with its own message, read top to bottom
        where = f" in {self.source}" if self.source else ""

        def bad(key: str, value: Any, fix: str) -> ConfigError:
            return ConfigError(f"{key} = {value!r}{where}: {fix}")

        types = {"name": str, "subnets": list, "instance_types": list, "max_vcpus": int, "min_vcpus": int,
                 "bucket": str, "prefix": str, "bucket_versioning": bool, "ecr_repository": str, "ami": str,
                 "root_volume_gb": int, "spot": bool, "placement_group": bool, "efa": bool,
                 "install_drivers": bool, "job_role_policy_arns": list, "tags": dict}
        for key, want in types.items():
            value = getattr(self, key)
            if not isinstance(value, want) or (want is int and isinstance(value, bool)):
                raise bad(key, value, f"must be a {want.__name__}")
        for key in ("region", "security_group", "vpc"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise bad(key, value, "must be a non-empty string (or leave it out)")
        if not _NAME.fullmatch(self.name):
            raise bad("name", self.name, "use 2-32 letters, digits and dashes, starting with a letter "
                      "(it prefixes every resource name)")
        if not self.subnets:
            raise ConfigError(f"subnets is missing{where}: list the subnet ids instances start in, all in one "
                              "Availability Zone for the placement group, e.g. subnets = [\"subnet-0abc...\"] "
                              "(aws ec2 describe-subnets lists them)")
        for key, start in _IDS.items():
            values = self.subnets if key == "subnets" else [getattr(self, key)]
            for v in values:
                if v is not None and (not isinstance(v, str) or not re.fullmatch(start + r"[0-9a-f]{8,17}", v)):
                    raise bad(key, v, f"expected an id like '{start}0123456789abcdef0'")
        if len(set(self.subnets)) != len(self.subnets):
            raise bad("subnets", self.subnets, "list each subnet once")
        if not self.instance_types or not all(isinstance(t, str) for t in self.instance_types):
            raise bad("instance_types", self.instance_types, "list at least one EC2 instance type, "
                      "e.g. [\"trn1.32xlarge\"]")
        for t in self.instance_types:
            if instance_type(t) is None:
                raise bad("instance_types", t, f"stoker does not know this instance type; use one of "
                          f"{known_names()}")
        kinds = {self._kind(t) for t in self.types}
        if {"neuron", "gpu"} <= kinds:
            raise bad("instance_types", self.instance_types, "mixes Neuron (trn/inf) and GPU types, which need "
                      "different AMIs; use one kind per infra (a second TOML with another name)")
        efa_counts = {t.efa_interfaces for t in self.types}
        if self.efa and len(efa_counts) > 1:
            raise bad("instance_types", self.instance_types,
                      "these types have different numbers of EFA network cards ("
                      + ", ".join(f"{t.name}: {t.efa_interfaces}" for t in self.types)
                      + "), and one launch template serves them all; list types with the same count, "
                      "or set efa = false")
        if self.min_vcpus < 0 or self.max_vcpus < 1:
            raise bad("max_vcpus" if self.max_vcpus < 1 else "min_vcpus",
                      self.max_vcpus if self.max_vcpus < 1 else self.min_vcpus, "must be positive")
        if self.min_vcpus > self.max_vcpus:
            raise bad("min_vcpus", self.min_vcpus, f"must not exceed max_vcpus ({self.max_vcpus}); "
                      "min_vcpus = 0 lets the compute environment scale to zero when idle")
        smallest = min(self.types, key=lambda t: t.vcpus)
        if self.max_vcpus < smallest.vcpus:
            raise bad("max_vcpus", self.max_vcpus, f"is below one {smallest.name} ({smallest.vcpus} vCPUs), so "
                      f"no instance could start; set max_vcpus to nodes x vCPUs, e.g. {4 * smallest.vcpus} "
                      f"for 4 nodes")
        if not self.bucket:
            raise ConfigError(f"bucket is missing{where}: name the S3 bucket of the store (created when it "
                              "does not exist; names are global), e.g. bucket = \"stoker-<account>-<region>\"")
        if not _BUCKET.fullmatch(self.bucket) or ".." in self.bucket:
            raise bad("bucket", self.bucket, "S3 bucket names are 3-63 lowercase letters, digits, dots and "
                      "dashes, starting and ending with a letter or digit")
        self.prefix = self.prefix.strip("/")
        if not self.prefix or not re.fullmatch(r"[A-Za-z0-9!_.*'()/-]+", self.prefix):
            raise bad("prefix", self.prefix, "use a non-empty key prefix of letters, digits and -_./ "
                      "(the store lives under s3://bucket/prefix/)")
        if not _ECR.fullmatch(self.ecr_repository) or len(self.ecr_repository) > 256:
            raise bad("ecr_repository", self.ecr_repository, "ECR names are lowercase letters, digits and "
                      "._-/ separators, e.g. \"stoker\"")
        if self.ami and not (re.fullmatch(r"ami-[0-9a-f]{8,17}", self.ami) or self.ami.startswith("ssm:/")):
            raise bad("ami", self.ami, "give an AMI id (ami-...) or an SSM parameter as ssm:/path, e.g. "
                      f"{SSM_AMI['neuron']!r}; leave it out for the ECS-optimized AMI that fits the types")
        if not 30 <= self.root_volume_gb <= 16384:
            raise bad("root_volume_gb", self.root_volume_gb, "must be between 30 and 16384 (GiB); images and "
                      "Neuron compile caches need room, 500 is a good start")
        for arn in self.job_role_policy_arns:
            if not isinstance(arn, str) or not re.fullmatch(r"arn:aws[a-z-]*:iam::(aws|\d{12}):policy/.+", arn):
                raise bad("job_role_policy_arns", arn, "expected managed policy ARNs, "
                          "e.g. arn:aws:iam::123456789012:policy/my-policy")
        for k, v in self.tags.items():
            if not isinstance(v, str) or k.startswith(("aws:", "stoker:")):
                raise bad("tags", {k: v}, "tag values are strings; keys may not start with aws: or stoker:")

    def check_creatable(self) -> None:
        """What `plan` and `apply` refuse before any AWS call, but loading does not: `destroy` and `status` must
        still read the config of an infra applied before the rule (from its TOML or its state file)."""
        if self.spot and (self.placement_group or self.efa_interfaces):
            # refused, not warned: a multi-node job on such a queue would wait in RUNNABLE, or fail, with no word
            on = " and ".join(k for k, v in (("placement_group", self.placement_group),
                                             ("efa", bool(self.efa_interfaces))) if v)
            where = f" in {self.source}" if self.source else ""
            raise ConfigError(
                f"spot = true{where}: AWS Batch does not run multi-node parallel jobs (num_parallel gangs) on Spot "
                f"compute environments, and {on} = true is there for multi-node jobs; set spot = false, or, for a "
                "queue of single-node jobs only, set placement_group = false and efa = false")

    # -- derived -------------------------------------------------------------------------------------------
    @property
    def types(self) -> list[InstanceType]:
        return [t for t in (instance_type(n) for n in self.instance_types) if t is not None]

    @staticmethod
    def _kind(t: InstanceType | str) -> str:
        t = instance_type(t) if isinstance(t, str) else t
        if t is None:
            return "cpu"
        return "neuron" if (t.trainium or t.inferentia) else ("gpu" if t.gpus else "cpu")

    @property
    def kind(self) -> str:
        """'neuron', 'gpu' or 'cpu': which ECS-optimized AMI and Batch image type fit."""
        kinds = {self._kind(t) for t in self.types}
        return "neuron" if "neuron" in kinds else ("gpu" if "gpu" in kinds else "cpu")

    @property
    def ami_source(self) -> str:
        return self.ami or SSM_AMI[self.kind]

    @property
    def efa_interfaces(self) -> int:
        """EFA interfaces in the launch template: one per network card (0: none)."""
        return self.types[0].efa_interfaces if self.efa and self.types else 0

    @property
    def neuron(self) -> bool:
        return self.kind == "neuron"

    @property
    def store_url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def resource_name(self, what: str) -> str:
        return f"{self.name}-{what}"

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "source"}


def from_dict(data: dict[str, Any], source: str = "") -> InfraConfig:
    known = {f.name for f in fields(InfraConfig)} - {"source"}
    for key in data:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(sorted(known))}"
            raise ConfigError(f"unknown key {key!r}{' in ' + source if source else ''}: {hint}")
    return InfraConfig(**data, source=source)


def load_config(path: str | Path | None = None) -> InfraConfig:
    """Read and validate the infra TOML (default ./stoker-infra.toml)."""
    from stoker.flow.parameters import parse_config_text

    p = Path(path or DEFAULT_CONFIG)
    if not p.is_file():
        raise ConfigError(f"no infra config at {p}: write one with `stoker infra init --config {p}` "
                          "and fill in subnets and bucket, or pass --config PATH")
    try:
        data = parse_config_text(p.read_text(encoding="utf-8"), json_format=False)
    except Exception as e:  # tomllib.TOMLDecodeError names line and column
        raise ConfigError(f"{p}: not valid TOML: {e}; fix that line (see `stoker infra init` for a "
                          "commented template)") from None
    return from_dict(data, source=str(p))


TEMPLATE = '''\
# stoker infra: what `stoker infra apply --config {path}` creates in your AWS account.
# `stoker infra plan` shows the changes first; `stoker infra destroy` removes what stoker created.

name = "stoker"            # prefix of every resource name (stoker-ce, stoker-queue, ...) and key of the state file
region = "us-east-1"       # where Trainium capacity is: us-east-1, us-east-2, us-west-2 ...

# Subnets the instances start in, all in ONE Availability Zone (a cluster placement group lives in one AZ).
# Multi-EFA instances get no public IP: use private subnets with a NAT gateway (or VPC endpoints for ECR, S3, logs).
subnets = ["subnet-0123456789abcdef0"]
# security_group = "sg-..." # optional; when absent stoker creates one allowing all traffic within itself (EFA)
# vpc = "vpc-..."           # only to create the security group; default: the subnet's VPC

instance_types = ["trn1.32xlarge"]   # one EFA interface per network card: 8 (trn1), 16 (trn1n), 32 (p5)
max_vcpus = 512            # 4 x trn1.32xlarge (128 vCPUs each)
min_vcpus = 0              # scale to zero when idle

bucket = "my-stoker-bucket"  # S3 store (created if missing; an existing bucket is used as is)
prefix = "stoker"            # store_url = s3://bucket/prefix; the job role may touch only this prefix
ecr_repository = "stoker"    # the image repository `stoker image` pushes to

# AMI: an ami-id, or ssm:/parameter. Default: the ECS-optimized Amazon Linux 2023 AMI for the types
# (Neuron AMI for trn/inf, GPU AMI for p/g).
# ami = "ssm:/aws/service/ecs/optimized-ami/amazon-linux-2023/neuron/recommended/image_id"
root_volume_gb = 500       # gp3 root volume: images and Neuron compile caches are large
spot = false               # Spot: single-node jobs only (Batch runs no multi-node job on Spot); needs
                           # placement_group = false and efa = false
placement_group = true     # cluster placement group: EFA needs all nodes of a job in one
'''
