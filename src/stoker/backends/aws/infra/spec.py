"""The desired resources as the exact request payloads boto3 is given, pure (no I/O): launch template data with
its user data, the compute environment, the job queue, tags. The plan compares them with what AWS has; tests
check them against botocore's service model and golden files.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from typing import Any

from stoker.backends.aws.infra.config import InfraConfig

PENDING = "(new)"  # an id that exists only once an earlier resource is created (plan output)
BOUNDARY = "==STOKERBOUNDARY=="


@dataclass
class Facts:
    """What the resources need from AWS and from each other, filled in as the plan reads and apply creates."""

    region: str
    account: str = "123456789012"
    partition: str = "aws"
    vpc: str | None = None
    ami: str = PENDING
    security_group: str = PENDING
    instance_role_arn: str = PENDING
    instance_profile_arn: str = PENDING
    job_role_arn: str = PENDING
    service_role_arn: str = PENDING
    launch_template_id: str = PENDING
    launch_template_version: str = PENDING
    compute_environment_arn: str = PENDING
    ecr_uri: str = PENDING
    store_key_secret_arn: str = PENDING


def tags(cfg: InfraConfig) -> dict[str, str]:
    """Every resource carries these: `stoker:infra` is what destroy trusts."""
    return {**cfg.tags, "stoker:managed": "true", "stoker:infra": cfg.name}


def tag_list(cfg: InfraConfig) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in sorted(tags(cfg).items())]


def tag_spec(cfg: InfraConfig, resource_type: str) -> list[dict[str, Any]]:
    return [{"ResourceType": resource_type, "Tags": tag_list(cfg)}]


def names(cfg: InfraConfig) -> dict[str, str]:
    return {
        "security_group": cfg.resource_name("efa"),
        "instance_role": cfg.resource_name("instance-role"),
        "instance_profile": cfg.resource_name("instance-profile"),
        "job_role": cfg.resource_name("job-role"),
        "placement_group": cfg.resource_name("cluster"),
        "launch_template": cfg.resource_name("lt"),
        "compute_environment": cfg.resource_name("ce"),
        "job_queue": cfg.resource_name("queue"),
        "ecr_repository": cfg.ecr_repository,
        "bucket": cfg.bucket,
        "store_key_secret": store_key_secret_name(cfg),
    }


def store_key_secret_name(cfg: InfraConfig) -> str:
    """The Secrets Manager secret holding the signing key of the store `s3://bucket/prefix`: one per store, so
    every infra (and teammate) using the store finds the same one."""
    return re.sub(r"[^A-Za-z0-9/_+=.@-]", "-", f"stoker/{cfg.bucket}/{cfg.prefix}/store-key")


ECS_AGENT_CONFIG = {
    # containers of multi-node jobs (awsvpc network mode) cannot reach instance metadata, so not the instance role
    "ECS_AWSVPC_BLOCK_IMDS": "true",
    # the job role's credentials come from the ECS agent's task credential endpoint (169.254.170.2), not IMDS
    "ECS_ENABLE_TASK_IAM_ROLE": "true",
}


EFA_INSTALLER_VERSION = "1.41.0"  # the nodes' EFA software; the same as the gpu images' (image.py)
FI_INFO = "/opt/amazon/efa/bin/fi_info"  # where the EFA installer puts libfabric's tools (not on PATH here)
BOOTSTRAP_TAG = "stoker-bootstrap"  # syslog tag; the failure line also goes to the console


def user_data_script(cfg: InfraConfig) -> str:
    """The node bootstrap: the ECS agent's settings (no instance metadata for awsvpc containers), memlock
    unlimited for the containers (EFA and Neuron pin memory), the EFA software (checked with `fi_info -p efa`)
    and the Neuron driver where the AMI lacks it.

    A node whose EFA or Neuron check fails must not take jobs: `stoker_fail` writes why to the console (`aws ec2
    get-console-output`) and syslog, masks the ECS agent so the node never registers with the cluster, and powers
    the node off, so Batch's Auto Scaling group replaces it instead of a gang starting on a broken fabric."""
    lines = [
        "#!/bin/bash",
        f"# stoker infra {cfg.name}: node bootstrap, runs before the ECS agent starts taking jobs",
        "set -uxo pipefail",
        "stoker_fail() {  # a node that cannot serve jobs: say why where users look, never join ECS, power off",
        f"  echo \"stoker bootstrap FAILED: $* (the node powers off and Batch replaces it)\" | tee /dev/console "
        f"| logger -t {BOOTSTRAP_TAG}",
        "  systemctl mask --now ecs.service",
        "  shutdown -h now",
        "  exit 1",
        "}",
        "# ECS agent: containers of multi-node (awsvpc) jobs get the job role from the agent, never the instance",
        "# role from instance metadata. Appended: Batch's own part of the user data writes ECS_CLUSTER here",
        "mkdir -p /etc/ecs",
        "cat >> /etc/ecs/ecs.config <<'EOF'",
        *(f"{k}={v}" for k, v in ECS_AGENT_CONFIG.items()),
        "EOF",
        "cat > /etc/security/limits.d/90-stoker-memlock.conf <<'EOF'",
        "* soft memlock unlimited",
        "* hard memlock unlimited",
        "EOF",
        "if [ -f /etc/sysconfig/docker ] && ! grep -q 'memlock=-1' /etc/sysconfig/docker; then",
        "  sed -i 's/^OPTIONS=\"/OPTIONS=\"--default-ulimit memlock=-1:-1 /' /etc/sysconfig/docker",
        "  systemctl try-restart docker || true",
        "fi",
    ]
    if cfg.install_drivers and cfg.efa_interfaces:
        v = EFA_INSTALLER_VERSION
        lines += [
            "# EFA: the EFA installer's full install (driver, rdma-core, libfabric with its efa provider), as the",
            "# Neuron samples' Batch launch template does. Not a module check: AL2023's kernel has an efa module",
            "# without that user space. Skipped when libfabric already sees the devices; the installer is idempotent",
            f"if ! {FI_INFO} -p efa >/dev/null 2>&1; then",
            f"  (cd /tmp && curl -fsSL --retry 5 -o aws-efa-installer.tar.gz "
            f"https://efa-installer.amazonaws.com/aws-efa-installer-{v}.tar.gz \\",
            "    && tar -xf aws-efa-installer.tar.gz && cd aws-efa-installer && ./efa_installer.sh -y)",
            "fi",
            f"{FI_INFO} -p efa || stoker_fail \"EFA: fi_info -p efa finds no EFA device after the EFA installer "
            f"{v}; see /var/log/cloud-init-output.log\"",
        ]
    if cfg.install_drivers and cfg.neuron:
        lines += [
            "# Neuron driver (/dev/neuron*): the ECS Neuron AMI has it, other AMIs get it here",
            "if ! modinfo neuron >/dev/null 2>&1; then",
            "  cat > /etc/yum.repos.d/neuron.repo <<'EOF'",
            "[neuron]",
            "name=Neuron YUM Repository",
            "baseurl=https://yum.repos.neuron.amazonaws.com",
            "enabled=1",
            "metadata_expire=0",
            "EOF",
            "  rpm --import https://yum.repos.neuron.amazonaws.com/GPG-PUB-KEY-AMAZON-AWS-NEURON.PUB",
            "  dnf install -y \"kernel-devel-$(uname -r)\" aws-neuronx-dkms",
            "fi",
            "modprobe neuron && ls /dev/neuron0 >/dev/null || stoker_fail \"Neuron: no /dev/neuron0 (driver "
            "aws-neuronx-dkms); see /var/log/cloud-init-output.log\"",
        ]
    return "\n".join(lines) + "\n"


def user_data(cfg: InfraConfig) -> str:
    """MIME multipart, as Batch requires of a launch template's user data (it adds its own part)."""
    return (
        "MIME-Version: 1.0\n"
        f'Content-Type: multipart/mixed; boundary="{BOUNDARY}"\n\n'
        f"--{BOUNDARY}\n"
        'Content-Type: text/x-shellscript; charset="us-ascii"\n\n'
        f"{user_data_script(cfg)}"
        f"--{BOUNDARY}--\n"
    )


def network_interfaces(cfg: InfraConfig, security_group: str) -> list[dict[str, Any]]:
    """One EFA interface per network card: card 0 is the primary interface (device 0), the others device 1."""
    return [{"NetworkCardIndex": i, "DeviceIndex": 0 if i == 0 else 1, "InterfaceType": "efa",
             "Groups": [security_group], "DeleteOnTermination": True}
            for i in range(cfg.efa_interfaces)]


def launch_template_data(cfg: InfraConfig, facts: Facts) -> dict[str, Any]:
    data: dict[str, Any] = {
        # IMDSv2 only, hop limit 1: a container one network hop away (bridge, awsvpc) gets no token, so not the
        # instance role. Nothing in a container needs IMDS: the job role comes from the ECS agent, the region from
        # the job's environment, the instance type from /sys/devices/virtual/dmi/id/product_name. Single-node
        # jobs share the host's network namespace (Batch's host mode), where no hop limit applies (docs/aws.md)
        "MetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 1, "HttpEndpoint": "enabled"},
        "BlockDeviceMappings": [{"DeviceName": "/dev/xvda", "Ebs": {
            "VolumeSize": cfg.root_volume_gb, "VolumeType": "gp3", "Encrypted": True, "DeleteOnTermination": True}}],
        "UserData": base64.b64encode(user_data(cfg).encode()).decode(),
    }
    if cfg.efa_interfaces:
        # security groups then live on each interface (EC2 refuses them at instance level too)
        data["NetworkInterfaces"] = network_interfaces(cfg, facts.security_group)
    return data


def image_type(cfg: InfraConfig) -> str:
    return "ECS_AL2023_NVIDIA" if cfg.kind == "gpu" else "ECS_AL2023"


def compute_resources(cfg: InfraConfig, facts: Facts) -> dict[str, Any]:
    n = names(cfg)
    res: dict[str, Any] = {
        "type": "SPOT" if cfg.spot else "EC2",
        # not BEST_FIT: only these allow in-place infrastructure updates (types, subnets, launch template, AMI)
        "allocationStrategy": "SPOT_PRICE_CAPACITY_OPTIMIZED" if cfg.spot else "BEST_FIT_PROGRESSIVE",
        "minvCpus": cfg.min_vcpus,
        "maxvCpus": cfg.max_vcpus,
        "instanceTypes": list(cfg.instance_types),
        "subnets": list(cfg.subnets),
        "instanceRole": facts.instance_profile_arn,
        "launchTemplate": {"launchTemplateId": facts.launch_template_id, "version": facts.launch_template_version},
        "ec2Configuration": [{"imageType": image_type(cfg), "imageIdOverride": facts.ami}],
        "tags": {**tags(cfg), "Name": cfg.resource_name("node")},  # on the instances it starts
    }
    if not cfg.efa_interfaces:
        # Batch refuses both: "Either compute environment Security Groups or Network Interfaces in Launch
        # template are exclusively allowed"
        res["securityGroupIds"] = [facts.security_group]
    if cfg.placement_group:
        res["placementGroup"] = n["placement_group"]
    return res


def compute_environment_request(cfg: InfraConfig, facts: Facts) -> dict[str, Any]:
    return {"computeEnvironmentName": names(cfg)["compute_environment"], "type": "MANAGED", "state": "ENABLED",
            "computeResources": compute_resources(cfg, facts), "serviceRole": facts.service_role_arn,
            "tags": tags(cfg)}


def job_queue_request(cfg: InfraConfig, facts: Facts) -> dict[str, Any]:
    return {"jobQueueName": names(cfg)["job_queue"], "state": "ENABLED", "priority": 1,
            "computeEnvironmentOrder": [{"order": 1, "computeEnvironment": facts.compute_environment_arn}],
            "tags": tags(cfg)}


def security_group_rules(group_id: str) -> list[dict[str, Any]]:
    """All traffic to and from the group itself, in and out: what EFA needs."""
    return [{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group_id}]}]


def has_self_rule(permissions: list[dict[str, Any]], group_id: str) -> bool:
    return any(p.get("IpProtocol") == "-1" and any(g.get("GroupId") == group_id
                                                   for g in p.get("UserIdGroupPairs", []))
               for p in permissions)


def has_open_egress(permissions: list[dict[str, Any]]) -> bool:
    """All traffic to anywhere (0.0.0.0/0): the default egress rule of a security group."""
    return any(p.get("IpProtocol") == "-1" and any(r.get("CidrIp") == "0.0.0.0/0" for r in p.get("IpRanges", []))
               for p in permissions)


def subset_diff(want: Any, have: Any, path: str = "") -> list[str]:
    """Where `have` (what AWS returns, which may add defaults) does not match `want`: every key of `want` must
    be in `have` with an equal value; lists match element by element."""
    if isinstance(want, dict):
        if not isinstance(have, dict):
            return [f"{path or 'value'}: {_short(have)} -> {_short(want)}"]
        out = []
        for k, v in want.items():
            out += subset_diff(v, have.get(k), f"{path}.{k}" if path else k)
        return out
    if isinstance(want, list):
        if not isinstance(have, list) or len(have) != len(want):
            return [f"{path}: {_short(have)} -> {_short(want)}"]
        out = []
        for i, (w, h) in enumerate(zip(want, have, strict=True)):
            out += subset_diff(w, h, f"{path}[{i}]")
        return out
    return [] if want == have else [f"{path}: {_short(have)} -> {_short(want)}"]


def _short(v: Any) -> str:
    if v is None:
        return "(none)"
    if isinstance(v, list) and v and isinstance(v[0], dict):
        return f"{len(v)} entries"
    s = str(v)
    return s if len(s) <= 48 else s[:45] + "..."
