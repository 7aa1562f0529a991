"""The IAM documents `stoker infra` creates, and a least-privilege check every one of them passes.

- instance role (EC2 instances of the compute environment): AWS's AmazonEC2ContainerServiceforEC2Role only (the
  ECS agent: register, pull images, send logs). That policy already allows the ECR pull actions on every
  repository ("Resource": "*"), so a pull-only grant scoped to stoker's repository would add nothing and restrict
  nothing: stoker adds none, and `apply` removes the `stoker-ecr-pull` inline policy earlier versions added;
- job role (the containers): read, write and delete objects under the store's prefix only, list the bucket only
  under that prefix, write log events to Batch's log group, and read the one secret that holds the store's
  signing key (secretsmanager:GetSecretValue on its ARN). Nothing else.
"""

from __future__ import annotations

import json
from typing import Any

VERSION = "2012-10-17"
ECS_INSTANCE_POLICY = "AmazonEC2ContainerServiceforEC2Role"
STORE_OBJECT_ACTIONS = ["s3:AbortMultipartUpload", "s3:DeleteObject", "s3:GetObject", "s3:PutObject"]
LOG_ACTIONS = ["logs:CreateLogStream", "logs:DescribeLogStreams", "logs:PutLogEvents"]


def trust_policy(service: str) -> dict[str, Any]:
    """Who may assume a role: `ec2.amazonaws.com` (instance role) or `ecs-tasks.amazonaws.com` (job role)."""
    return {"Version": VERSION, "Statement": [
        {"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}]}


def job_role_policy(bucket: str, prefix: str, log_group: str, *, partition: str = "aws", region: str = "*",
                    account: str = "*", key_secret_arn: str | None = None) -> dict[str, Any]:
    """The job role's inline policy: the store's prefix, the Batch log group and (`key_secret_arn`) reading the
    secret that holds the store's signing key, nothing more."""
    prefix = prefix.strip("/")
    logs = f"arn:{partition}:logs:{region}:{account}:log-group:{log_group}"
    return {"Version": VERSION, "Statement": [
        {"Sid": "StoreObjects", "Effect": "Allow", "Action": STORE_OBJECT_ACTIONS,
         "Resource": f"arn:{partition}:s3:::{bucket}/{prefix}/*"},
        {"Sid": "StoreList", "Effect": "Allow", "Action": "s3:ListBucket",
         "Resource": f"arn:{partition}:s3:::{bucket}",
         "Condition": {"StringLike": {"s3:prefix": [prefix, f"{prefix}/*"]}}},
        {"Sid": "BatchLogs", "Effect": "Allow", "Action": LOG_ACTIONS,
         "Resource": [logs, f"{logs}:*"]},
    ] + ([{"Sid": "StoreKey", "Effect": "Allow", "Action": "secretsmanager:GetSecretValue",
           "Resource": key_secret_arn}] if key_secret_arn else [])}


def instance_role_policies(*, partition: str = "aws") -> dict[str, Any]:
    """{"managed": [policy ARNs to attach], "inline": {name: document}} of the instance role: the ECS agent's
    managed policy, which covers image pulls from any repository of the account; no inline policy."""
    return {"managed": [f"arn:{partition}:iam::aws:policy/service-role/{ECS_INSTANCE_POLICY}"], "inline": {}}


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def check_least_privilege(doc: dict[str, Any] | str) -> list[str]:
    """Problems of an IAM policy document (empty when fine): an Allow of every action (`*`) or of a whole
    service (`s3:*`) on every resource (`*`), and NotAction / NotResource in an Allow, which grant all the rest."""
    if isinstance(doc, str):
        doc = json.loads(doc)
    problems = []
    for i, st in enumerate(_as_list(doc.get("Statement"))):
        if st.get("Effect") != "Allow":
            continue
        label = f"statement {st.get('Sid') or i}"
        if "NotAction" in st:
            problems.append(f"{label}: Allow with NotAction grants every other action; list the actions")
        if "NotResource" in st:
            problems.append(f"{label}: Allow with NotResource grants every other resource; list the resources")
        resources = _as_list(st.get("Resource"))
        if "Principal" in st and not resources:
            continue  # a trust policy statement
        if "*" not in resources:
            continue
        for action in _as_list(st.get("Action")):
            if action == "*" or (isinstance(action, str) and action.endswith(":*")):
                problems.append(f"{label}: Action {action!r} on Resource '*'; name the actions and resources")
    return problems


def normalized(doc: dict[str, Any] | str | None) -> str:
    """A canonical form to compare documents: one-element lists and scalars are the same, order is not."""
    if doc is None:
        return ""
    if isinstance(doc, str):
        doc = json.loads(doc)

    def norm(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: norm(x) for k, x in v.items()}
        if isinstance(v, list):
            items = [norm(x) for x in v]
            return items[0] if len(items) == 1 else sorted(items, key=lambda x: json.dumps(x, sort_keys=True))
        return v

    return json.dumps(norm(doc), sort_keys=True)
