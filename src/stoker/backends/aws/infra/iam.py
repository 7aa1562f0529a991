"""IAM: the instance role and its instance profile, the job role, and Batch's service-linked role."""

from __future__ import annotations

import json
from typing import Any

from stoker.backends.aws.infra.base import Actual, Resource, tag_dict
from stoker.backends.aws.infra.config import LOG_GROUP
from stoker.backends.aws.infra.policies import instance_role_policies, job_role_policy, normalized, trust_policy
from stoker.backends.aws.infra.spec import PENDING, tag_list, tags

NO_ENTITY = ("NoSuchEntity", "NoSuchEntityException")


class Role(Resource):
    """A role stoker owns outright: its trust policy, inline policies and attached managed policies are what
    the plan says, and anything else found on it is removed (the job role stays least-privilege)."""

    service = ""
    description = ""

    def policies(self) -> tuple[list[str], dict[str, dict[str, Any]]]:
        """(managed policy ARNs, {inline name: document})."""
        raise NotImplementedError

    def read(self) -> Actual | None:
        got = self.ctx.call("iam", "get_role", self.label, missing=NO_ENTITY, RoleName=self.name)
        if got is None:
            return None
        role = got["Role"]
        actual = Actual(id=self.name, arn=role["Arn"], tags=tag_dict(role.get("Tags")),
                        data={"trust": role.get("AssumeRolePolicyDocument")})
        if self.owned(actual):
            inline = {}
            for name in self.ctx.call("iam", "list_role_policies", self.label, RoleName=self.name)["PolicyNames"]:
                inline[name] = self.ctx.call("iam", "get_role_policy", self.label, RoleName=self.name,
                                             PolicyName=name)["PolicyDocument"]
            attached = self.ctx.call("iam", "list_attached_role_policies", self.label, RoleName=self.name)
            actual.data.update(inline=inline, managed=[p["PolicyArn"] for p in attached["AttachedPolicies"]])
        return actual

    def diff(self, actual: Actual) -> list[str]:
        managed, inline = self.policies()
        out = []
        if normalized(_doc(actual.data.get("trust"))) != normalized(trust_policy(self.service)):
            out.append(f"trust policy -> {self.service}")
        have = actual.data.get("inline", {})
        for name, doc in inline.items():
            if name not in have:
                out.append(f"inline policy {name}: add")
            elif normalized(_doc(have[name])) != normalized(doc):
                out.append(f"inline policy {name}: update")
        out += [f"inline policy {n}: remove (not in the plan)" for n in have if n not in inline]
        now = actual.data.get("managed", [])
        out += [f"managed policy {a}: attach" for a in managed if a not in now]
        out += [f"managed policy {a}: detach (not in the plan)" for a in now if a not in managed]
        return out

    def create(self) -> Actual:
        got = self.ctx.call("iam", "create_role", self.label, RoleName=self.name, Description=self.description,
                            AssumeRolePolicyDocument=json.dumps(trust_policy(self.service)),
                            Tags=tag_list(self.ctx.cfg))["Role"]
        actual = Actual(id=self.name, arn=got["Arn"], data={"trust": trust_policy(self.service)})
        self.record(actual, created=True)
        self.update(actual, self.diff(actual))
        return actual

    def update(self, actual: Actual, diffs: list[str]) -> Actual:
        managed, inline = self.policies()
        for d in diffs:
            if d.startswith("trust"):
                self.ctx.call("iam", "update_assume_role_policy", self.label, RoleName=self.name,
                              PolicyDocument=json.dumps(trust_policy(self.service)))
            elif d.startswith("inline policy"):
                name = d.split()[2].rstrip(":")
                if name in inline:
                    self.ctx.call("iam", "put_role_policy", self.label, RoleName=self.name, PolicyName=name,
                                  PolicyDocument=json.dumps(inline[name]))
                else:
                    self.ctx.call("iam", "delete_role_policy", self.label, RoleName=self.name, PolicyName=name)
            elif d.startswith("managed policy"):
                arn = d.split()[2].rstrip(":")
                op = "attach_role_policy" if arn in managed else "detach_role_policy"
                self.ctx.call("iam", op, self.label, RoleName=self.name, PolicyArn=arn)
        missing = {k: v for k, v in tags(self.ctx.cfg).items() if actual.tags.get(k) != v}
        if missing and actual.tags:  # a new role got its tags when it was created
            self.ctx.call("iam", "tag_role", self.label, RoleName=self.name,
                          Tags=[{"Key": k, "Value": v} for k, v in sorted(missing.items())])
        return actual

    def delete(self, actual: Actual, *, force: bool = False) -> None:
        profiles = self.ctx.call("iam", "list_instance_profiles_for_role", self.label, RoleName=self.name)
        for p in profiles.get("InstanceProfiles", []):
            self.ctx.call("iam", "remove_role_from_instance_profile", self.label, missing=NO_ENTITY,
                          InstanceProfileName=p["InstanceProfileName"], RoleName=self.name)
        attached = self.ctx.call("iam", "list_attached_role_policies", self.label, RoleName=self.name)
        for p in attached["AttachedPolicies"]:
            self.ctx.call("iam", "detach_role_policy", self.label, RoleName=self.name, PolicyArn=p["PolicyArn"])
        for name in self.ctx.call("iam", "list_role_policies", self.label, RoleName=self.name)["PolicyNames"]:
            self.ctx.call("iam", "delete_role_policy", self.label, RoleName=self.name, PolicyName=name)
        self.ctx.call("iam", "delete_role", self.label, missing=NO_ENTITY, RoleName=self.name)

    def describe(self, actual: Actual) -> str:
        return actual.arn or actual.id


def _doc(doc: Any) -> Any:
    """IAM documents come back URL-decoded and parsed by boto3; a string (other clients) is parsed here."""
    if isinstance(doc, str):
        from urllib.parse import unquote

        return json.loads(unquote(doc))
    return doc


class InstanceRole(Role):
    key = "instance_role"
    kind = "IAM role"
    service = "ec2.amazonaws.com"
    description = "stoker: Batch compute environment instances (ECS agent, image pulls)"

    def policies(self) -> tuple[list[str], dict[str, dict[str, Any]]]:
        p = instance_role_policies(partition=self.ctx.facts.partition)
        return p["managed"], p["inline"]

    def publish(self, actual: Actual | None, changing: bool = False) -> None:
        self.ctx.facts.instance_role_arn = actual.arn if actual and actual.arn else PENDING


class JobRole(Role):
    key = "job_role"
    kind = "IAM role"
    service = "ecs-tasks.amazonaws.com"
    description = "stoker: Batch jobs (the store's prefix, its key secret and the Batch log group only)"

    def policies(self) -> tuple[list[str], dict[str, dict[str, Any]]]:
        f, cfg = self.ctx.facts, self.ctx.cfg
        doc = job_role_policy(cfg.bucket, cfg.prefix, LOG_GROUP, partition=f.partition, region=f.region,
                              account=f.account, key_secret_arn=f.store_key_secret_arn)
        return list(cfg.job_role_policy_arns), {"stoker-store": doc}

    def publish(self, actual: Actual | None, changing: bool = False) -> None:
        self.ctx.facts.job_role_arn = actual.arn if actual and actual.arn else PENDING


class InstanceProfile(Resource):
    key = "instance_profile"
    kind = "IAM instance profile"

    @property
    def role(self) -> str:
        return self.ctx.names["instance_role"]

    def read(self) -> Actual | None:
        got = self.ctx.call("iam", "get_instance_profile", self.label, missing=NO_ENTITY,
                            InstanceProfileName=self.name)
        if got is None:
            return None
        p = got["InstanceProfile"]
        return Actual(id=self.name, arn=p["Arn"], tags=tag_dict(p.get("Tags")),
                      data={"roles": [r["RoleName"] for r in p.get("Roles", [])]})

    def diff(self, actual: Actual) -> list[str]:
        roles = actual.data.get("roles", [])
        return [] if roles == [self.role] else [f"roles {roles or '(none)'} -> [{self.role}]"]

    def create(self) -> Actual:
        got = self.ctx.call("iam", "create_instance_profile", self.label, InstanceProfileName=self.name,
                            Tags=tag_list(self.ctx.cfg))["InstanceProfile"]
        actual = Actual(id=self.name, arn=got["Arn"], data={"roles": []})
        self.record(actual, created=True)
        return self.update(actual, self.diff(actual))

    def update(self, actual: Actual, diffs: list[str]) -> Actual:
        for r in actual.data.get("roles", []):
            if r != self.role:
                self.ctx.call("iam", "remove_role_from_instance_profile", self.label,
                              InstanceProfileName=self.name, RoleName=r)
        if self.role not in actual.data.get("roles", []):
            self.ctx.call("iam", "add_role_to_instance_profile", self.label, InstanceProfileName=self.name,
                          RoleName=self.role)
        actual.data["roles"] = [self.role]
        return actual

    def delete(self, actual: Actual, *, force: bool = False) -> None:
        for r in actual.data.get("roles", []):
            self.ctx.call("iam", "remove_role_from_instance_profile", self.label, missing=NO_ENTITY,
                          InstanceProfileName=self.name, RoleName=r)
        self.ctx.call("iam", "delete_instance_profile", self.label, missing=NO_ENTITY,
                      InstanceProfileName=self.name)

    def publish(self, actual: Actual | None, changing: bool = False) -> None:
        self.ctx.facts.instance_profile_arn = actual.arn if actual and actual.arn else PENDING

    def describe(self, actual: Actual) -> str:
        return f"{actual.arn} (role {', '.join(actual.data.get('roles', [])) or 'none'})"


class ServiceLinkedRole(Resource):
    """AWSServiceRoleForBatch: Batch's own role, one per account. Created when missing (Batch would create it
    too), never deleted: other compute environments of the account use it."""

    key = "service_role"
    kind = "Batch service-linked role"
    adoptable = True
    keep_on_destroy = True
    use_note = "Batch's own role, shared by the account: used, never deleted"
    path = "/aws-service-role/batch.amazonaws.com/"

    @property
    def name(self) -> str:
        return "AWSServiceRoleForBatch"

    def owned(self, actual: Actual) -> bool:
        return False

    def read(self) -> Actual | None:
        got = self.ctx.call("iam", "get_role", self.label, missing=NO_ENTITY, RoleName=self.name)
        if got is None:  # under another spelling (moto's), else missing
            roles = self.ctx.call("iam", "list_roles", self.label, PathPrefix=self.path).get("Roles", [])
            got = {"Role": roles[0]} if roles else None
        return Actual(id=got["Role"]["RoleName"], arn=got["Role"]["Arn"]) if got else None

    def create(self) -> Actual:
        role = self.ctx.call("iam", "create_service_linked_role", self.label,
                             AWSServiceName="batch.amazonaws.com")["Role"]
        return Actual(id=role["RoleName"], arn=role["Arn"])

    def record(self, actual: Actual, created: bool) -> None:
        # never stoker's to delete, even when stoker asked IAM to create it
        self.ctx.state.record(self.key, kind=self.kind, name=actual.id, id=actual.id, arn=actual.arn,
                              created_by_stoker=False)

    def publish(self, actual: Actual | None, changing: bool = False) -> None:
        self.ctx.facts.service_role_arn = actual.arn if actual and actual.arn else PENDING

    def describe(self, actual: Actual) -> str:
        return actual.arn or actual.id
