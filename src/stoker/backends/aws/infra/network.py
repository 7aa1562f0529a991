"""EC2: the security group (all traffic within itself, as EFA needs), the cluster placement group and the
launch template (EFA interfaces, IMDSv2, root volume, user data)."""

from __future__ import annotations

from stoker.backends.aws.infra.base import Actual, Context, Resource, tag_dict
from stoker.backends.aws.infra.spec import (
    PENDING,
    has_open_egress,
    has_self_rule,
    launch_template_data,
    security_group_rules,
    subset_diff,
    tag_spec,
)

SG_MISSING = ("InvalidGroup.NotFound", "InvalidGroupId.NotFound", "InvalidGroupId.Malformed")
EFA_RULE_FIX = ("EFA needs all traffic to and from the group itself: run `aws ec2 authorize-security-group-ingress "
                "--group-id {sg} --ip-permissions 'IpProtocol=-1,UserIdGroupPairs=[{{GroupId={sg}}}]'` and the same "
                "with authorize-security-group-egress, or leave security_group out and stoker creates one")


def check_default_security_group(ctx: Context) -> None:
    """Warn when the VPC's default security group would break multi-node jobs.

    Batch runs a multi-node job's containers in awsvpc mode: each node's container gets a network interface of
    its own, with the compute environment's security groups, or the VPC's default group when it names none
    (AWS Batch User Guide, "Compute environment considerations for MNP"). With EFA the launch template's
    interfaces carry stoker's group and the compute environment may name none (Batch refuses both), so the
    nodes' containers talk to each other (torchrun's rendezvous, NCCL/gloo's TCP bootstrap) and to S3 through
    the default group: it must allow all traffic from itself and all traffic out.
    """
    if not ctx.cfg.efa_interfaces or not ctx.facts.vpc:
        return  # without EFA the compute environment names stoker's group, which the task interfaces get
    vpc, region = ctx.facts.vpc, ctx.facts.region
    got = ctx.call("ec2", "describe_security_groups", f"the default security group of {vpc}",
                   Filters=[{"Name": "vpc-id", "Values": [vpc]}, {"Name": "group-name", "Values": ["default"]}])
    groups = got.get("SecurityGroups", [])
    if not groups:
        return
    g = groups[0]
    sg = g["GroupId"]
    lacks, fixes = [], []
    if not has_self_rule(g.get("IpPermissions", []), sg):
        lacks.append("all traffic from itself (the nodes reach each other)")
        fixes.append(f"aws ec2 authorize-security-group-ingress --region {region} --group-id {sg} "
                     f"--ip-permissions 'IpProtocol=-1,UserIdGroupPairs=[{{GroupId={sg}}}]'")
    if not has_open_egress(g.get("IpPermissionsEgress", [])):
        lacks.append("all traffic out (the nodes reach each other, S3 and the endpoints)")
        fixes.append(f"aws ec2 authorize-security-group-egress --region {region} --group-id {sg} "
                     "--ip-permissions 'IpProtocol=-1,IpRanges=[{CidrIp=0.0.0.0/0}]'")
    if lacks:
        ctx.warnings.append(
            f"the containers of multi-node jobs get {vpc}'s default security group {sg} (Batch gives their awsvpc "
            "network interfaces the compute environment's groups, and with EFA it names none), and that group "
            f"does not allow {' nor '.join(lacks)}: the nodes of a gang would not rendezvous. Fix: "
            + " and ".join(f"`{f}`" for f in fixes))


class SecurityGroup(Resource):
    """The configured security group (used as is, checked for EFA's self-referencing rules), or one stoker
    creates in the subnets' VPC."""

    key = "security_group"
    kind = "security group"

    @property
    def given(self) -> str | None:
        return self.ctx.cfg.security_group

    @property
    def adoptable(self) -> bool:  # type: ignore[override]
        return self.given is not None

    @property
    def name(self) -> str:
        return self.given or self.ctx.names["security_group"]

    def read(self) -> Actual | None:
        if self.given:
            got = self.ctx.call("ec2", "describe_security_groups", self.label, missing=SG_MISSING,
                                GroupIds=[self.given])
            groups = (got or {}).get("SecurityGroups", [])
            if not groups:
                from stoker.errors import ConfigError

                raise ConfigError(f"security_group = {self.given!r}: not found in {self.ctx.facts.region}; "
                                  "give a security group of the subnets' VPC, or leave it out to create one")
        else:
            filters = [{"Name": "group-name", "Values": [self.name]}]
            if self.ctx.facts.vpc:
                filters.append({"Name": "vpc-id", "Values": [self.ctx.facts.vpc]})
            groups = self.ctx.call("ec2", "describe_security_groups", self.label,
                                   Filters=filters)["SecurityGroups"]
            groups.sort(key=lambda g: tag_dict(g.get("Tags")).get("stoker:infra") != self.ctx.cfg.name)
            if not groups:
                return None
        g = groups[0]
        actual = Actual(id=g["GroupId"], arn=g.get("SecurityGroupArn"), tags=tag_dict(g.get("Tags")),
                        data={"in": g.get("IpPermissions", []), "out": g.get("IpPermissionsEgress", []),
                              "vpc": g.get("VpcId")})
        if self.given and self.ctx.cfg.efa_interfaces and not self._self_rules(actual) == (True, True):
            self.ctx.warnings.append(f"security group {self.given} lacks a self-referencing all-traffic rule: "
                                     + EFA_RULE_FIX.format(sg=self.given))
        return actual

    def _self_rules(self, actual: Actual) -> tuple[bool, bool]:
        return (has_self_rule(actual.data.get("in", []), actual.id),
                has_self_rule(actual.data.get("out", []), actual.id))

    def diff(self, actual: Actual) -> list[str]:
        ingress, egress = self._self_rules(actual)
        return ([] if ingress else ["ingress: all traffic from itself"]) + (
            [] if egress else ["egress: all traffic to itself"])

    def create(self) -> Actual:
        got = self.ctx.call("ec2", "create_security_group", self.label, GroupName=self.name,
                            Description=f"stoker {self.ctx.cfg.name}: all traffic within the group (EFA)",
                            VpcId=self.ctx.facts.vpc, TagSpecifications=tag_spec(self.ctx.cfg, "security-group"))
        actual = Actual(id=got["GroupId"], arn=got.get("SecurityGroupArn"))
        self.record(actual, created=True)
        return self.update(actual, self.diff(actual))

    def update(self, actual: Actual, diffs: list[str]) -> Actual:
        for d in diffs:
            op = "authorize_security_group_ingress" if d.startswith("ingress") else "authorize_security_group_egress"
            self.ctx.call("ec2", op, self.label, GroupId=actual.id, IpPermissions=security_group_rules(actual.id))
        return actual

    def delete(self, actual: Actual, *, force: bool = False) -> None:
        # network interfaces of terminating instances hold it for a while
        self.ctx.retry(f"{self.label} is released by terminating instances",
                       lambda: self.ctx.call("ec2", "delete_security_group", self.label, missing=SG_MISSING,
                                             GroupId=actual.id),
                       ("DependencyViolation",), "delete the instances or interfaces that still use it")

    def publish(self, actual: Actual | None, changing: bool = False) -> None:
        self.ctx.facts.security_group = actual.id if actual else PENDING

    def describe(self, actual: Actual) -> str:
        ingress, egress = self._self_rules(actual)
        rules = "EFA rules ok" if ingress and egress else "no self-referencing rule (EFA will not work)"
        return f"{actual.id} in {actual.data.get('vpc')}, {rules}"


class PlacementGroup(Resource):
    key = "placement_group"
    kind = "placement group"

    def wanted(self) -> bool:
        return self.ctx.cfg.placement_group

    def read(self) -> Actual | None:
        got = self.ctx.call("ec2", "describe_placement_groups", self.label,
                            Filters=[{"Name": "group-name", "Values": [self.name]}])
        groups = [g for g in got.get("PlacementGroups", []) if g.get("State") not in ("deleting", "deleted")]
        if not groups:
            return None
        g = groups[0]
        return Actual(id=g.get("GroupId") or self.name, arn=g.get("GroupArn"), tags=tag_dict(g.get("Tags")),
                      data={"strategy": g.get("Strategy"), "state": g.get("State")})

    def diff(self, actual: Actual) -> list[str]:
        if actual.data.get("strategy") != "cluster":
            from stoker.errors import ConfigError

            raise ConfigError(f"{self.label} has strategy {actual.data.get('strategy')!r}, not 'cluster', and "
                              "a placement group cannot change strategy: run `stoker infra destroy`, then apply")
        return []

    def create(self) -> Actual:
        got = self.ctx.call("ec2", "create_placement_group", self.label, GroupName=self.name, Strategy="cluster",
                            TagSpecifications=tag_spec(self.ctx.cfg, "placement-group"))
        g = got.get("PlacementGroup", {})
        actual = Actual(id=g.get("GroupId") or self.name, arn=g.get("GroupArn"),
                        data={"strategy": "cluster", "state": g.get("State", "available")})
        self.record(actual, created=True)
        return actual

    def delete(self, actual: Actual, *, force: bool = False) -> None:
        self.ctx.retry(f"instances leave {self.label}",
                       lambda: self.ctx.call("ec2", "delete_placement_group", self.label,
                                             missing=("InvalidPlacementGroup.Unknown",), GroupName=self.name),
                       ("InvalidPlacementGroup.InUse",), "terminate the instances still in the placement group")

    def describe(self, actual: Actual) -> str:
        return f"{actual.data.get('strategy')}, {actual.data.get('state')}"


class LaunchTemplate(Resource):
    key = "launch_template"
    kind = "launch template"

    def read(self) -> Actual | None:
        got = self.ctx.call("ec2", "describe_launch_templates", self.label, missing=(
            "InvalidLaunchTemplateName.NotFoundException", "InvalidLaunchTemplateId.NotFound"),
            LaunchTemplateNames=[self.name])
        if not got or not got.get("LaunchTemplates"):
            return None
        lt = got["LaunchTemplates"][0]
        version = str(lt["DefaultVersionNumber"])
        versions = self.ctx.call("ec2", "describe_launch_template_versions", self.label,
                                 LaunchTemplateId=lt["LaunchTemplateId"], Versions=[version])
        data = versions["LaunchTemplateVersions"][0].get("LaunchTemplateData", {})
        return Actual(id=lt["LaunchTemplateId"], tags=tag_dict(lt.get("Tags")),
                      data={"version": version, "template": data})

    def desired(self) -> dict:
        return launch_template_data(self.ctx.cfg, self.ctx.facts)

    def diff(self, actual: Actual) -> list[str]:
        want, have = self.desired(), actual.data.get("template", {})
        out = subset_diff(want, have)
        out += [f"{k}: remove" for k in ("NetworkInterfaces", "SecurityGroupIds", "InstanceType")
                if k in have and k not in want]
        return out

    def create(self) -> Actual:
        got = self.ctx.call("ec2", "create_launch_template", self.label, LaunchTemplateName=self.name,
                            VersionDescription="stoker infra", LaunchTemplateData=self.desired(),
                            TagSpecifications=tag_spec(self.ctx.cfg, "launch-template"))["LaunchTemplate"]
        actual = Actual(id=got["LaunchTemplateId"], data={"version": str(got.get("DefaultVersionNumber", 1))})
        self.record(actual, created=True)
        return actual

    def update(self, actual: Actual, diffs: list[str]) -> Actual:
        got = self.ctx.call("ec2", "create_launch_template_version", self.label, LaunchTemplateId=actual.id,
                            VersionDescription="stoker infra", LaunchTemplateData=self.desired())
        version = str(got["LaunchTemplateVersion"]["VersionNumber"])
        self.ctx.call("ec2", "modify_launch_template", self.label, LaunchTemplateId=actual.id,
                      DefaultVersion=version)
        actual.data.update(version=version, template=self.desired())
        return actual

    def delete(self, actual: Actual, *, force: bool = False) -> None:
        self.ctx.call("ec2", "delete_launch_template", self.label, missing=(
            "InvalidLaunchTemplateId.NotFound", "InvalidLaunchTemplateName.NotFoundException"),
            LaunchTemplateId=actual.id)

    def publish(self, actual: Actual | None, changing: bool = False) -> None:
        self.ctx.facts.launch_template_id = actual.id if actual else PENDING
        self.ctx.facts.launch_template_version = PENDING if changing or not actual else actual.data["version"]

    def describe(self, actual: Actual) -> str:
        nics = len(actual.data.get("template", {}).get("NetworkInterfaces", []))
        return f"{actual.id} version {actual.data.get('version')}" + (f", {nics} EFA interfaces" if nics else "")
