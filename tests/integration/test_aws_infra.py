"""`stoker infra` against moto's server on loopback: plan, apply, apply again (no create or update call),
destroy (dependency order, nothing of stoker's left), a failure half-way, resources in the way, the CLI.

What moto does not model is stood in for here, and those requests are checked against botocore's service model:
- EC2 placement groups (moto implements none): `PlacementGroups` keeps them in memory;
- a compute environment without `securityGroupIds` (what Batch requires when the launch template carries EFA
  interfaces; moto insists on them): `BatchCompat` hands moto the launch template's group and hides it again;
- moto ignores `computeResources` in UpdateComputeEnvironment: updates are checked by the request sent;
- moto's Batch jobs end (SUCCEEDED) as soon as they are submitted: `Loopback.live` holds the jobs a test wants
  still running, and `BatchCompat.list_jobs` answers for them, one job per page (to exercise pagination).
Every other request goes through boto3's own parameter validation to moto and is recorded for the asserts.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from stoker.backends.aws.infra import (
    Clients,
    InfraConfig,
    apply,
    check_least_privilege,
    destroy,
    load_outputs,
)
from stoker.backends.aws.infra import plan as make_plan
from stoker.backends.aws.infra import status as infra_status
from stoker.backends.aws.infra.state import OUTPUT_KEYS, State, record_image, state_path
from stoker.errors import BackendError, ConfigError

pytestmark = pytest.mark.aws
SECRET = "stoker/stoker-test-bucket/stoker/store-key"  # the Secrets Manager secret of the store's signing key
READS = ("Describe", "Get", "List", "Head")


def validate(client: Any, op: str, params: dict) -> None:
    from botocore.validate import validate_parameters

    validate_parameters(params, client.meta.service_model.operation_model(op).input_shape)


class PlacementGroups:
    """EC2 placement groups in memory (moto has none), shared by every client of a test."""

    def __init__(self) -> None:
        self.groups: dict[str, dict] = {}


class Ec2WithPlacementGroups:
    def __init__(self, ec2: Any, store: PlacementGroups, calls: list) -> None:
        self._ec2, self._store, self._calls = ec2, store, calls

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ec2, name)

    def _check(self, op: str, params: dict) -> None:
        validate(self._ec2, op, params)
        self._calls.append(("ec2", op, params))

    def create_placement_group(self, **params: Any) -> dict:
        self._check("CreatePlacementGroup", params)
        g = {"GroupName": params["GroupName"], "Strategy": params["Strategy"], "State": "available",
             "GroupId": f"pg-{len(self._store.groups):017x}", "Tags": params["TagSpecifications"][0]["Tags"]}
        self._store.groups[params["GroupName"]] = g
        return {"PlacementGroup": g}

    def describe_placement_groups(self, **params: Any) -> dict:
        self._check("DescribePlacementGroups", params)
        wanted = params["Filters"][0]["Values"]
        return {"PlacementGroups": [g for n, g in self._store.groups.items() if n in wanted]}

    def delete_placement_group(self, **params: Any) -> dict:
        self._check("DeletePlacementGroup", params)
        self._store.groups.pop(params["GroupName"])
        return {}


class BatchCompat:
    """moto's Batch, given the security group it insists on when the launch template carries it, and with jobs
    that have not ended (`live`: job id -> status) where moto's all ended at once."""

    def __init__(self, batch: Any, ec2: Any, calls: list, added: set, live: dict[str, str]) -> None:
        self._batch, self._ec2, self._calls, self._added, self._live = batch, ec2, calls, added, live

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batch, name)

    def list_jobs(self, **params: Any) -> dict:
        validate(self._batch, "ListJobs", params)
        self._calls.append(("batch", "ListJobs*", params))
        summaries = self._batch.list_jobs(jobQueue=params["jobQueue"])["jobSummaryList"]  # every status
        mine = [{**j, "status": self._live[j["jobId"]]} for j in summaries
                if self._live.get(j["jobId"]) == params["jobStatus"]]
        start = int(params.get("nextToken", 0))
        page = {"jobSummaryList": mine[start:start + 1]}
        if start + 1 < len(mine):
            page["nextToken"] = str(start + 1)
        return page

    def terminate_job(self, **params: Any) -> dict:
        self._live.pop(params["jobId"], None)
        return self._batch.terminate_job(**params)

    def create_compute_environment(self, **params: Any) -> dict:
        validate(self._batch, "CreateComputeEnvironment", params)
        self._calls.append(("batch", "CreateComputeEnvironment*", params))  # the request as stoker sent it
        res = params["computeResources"]
        if "securityGroupIds" not in res:
            lt = res["launchTemplate"]
            data = self._ec2.describe_launch_template_versions(
                LaunchTemplateId=lt["launchTemplateId"], Versions=[lt["version"]]
            )["LaunchTemplateVersions"][0]["LaunchTemplateData"]
            params = {**params, "computeResources": {**res,
                                                     "securityGroupIds": data["NetworkInterfaces"][0]["Groups"]}}
            self._added.add(params["computeEnvironmentName"])
        return self._batch.create_compute_environment(**params)

    def describe_compute_environments(self, **params: Any) -> dict:
        got = self._batch.describe_compute_environments(**params)
        for ce in got["computeEnvironments"]:
            if ce["computeEnvironmentName"] in self._added:
                ce["computeResources"].pop("securityGroupIds", None)
        return got

    def delete_compute_environment(self, **params: Any) -> dict:
        self._added.discard(params["computeEnvironment"])
        return self._batch.delete_compute_environment(**params)


class Loopback:
    """The moto AWS of one test, with every call recorded as (service, operation, params)."""

    def __init__(self, aws: Any) -> None:
        self.aws = aws
        self.calls: list[tuple[str, str, dict]] = []
        self.placement = PlacementGroups()
        self.added: set[str] = set()
        self.live: dict[str, str] = {}  # job id -> status: jobs stood in as not ended (moto's end at once)
        self.fail: dict[str, Exception] = {}  # operation -> error to raise instead of calling
        import boto3

        self.session = boto3.session.Session(region_name="us-east-1")
        self.session.events.register("before-parameter-build", self._record)
        self.raw_ec2 = ec2 = aws.client("ec2")
        subnets = ec2.describe_subnets()["Subnets"]
        self.subnets = {s["AvailabilityZone"]: s["SubnetId"] for s in subnets}
        self.subnet = self.subnets["us-east-1a"]

    def clients(self) -> Clients:
        """Fresh clients (as a new command would make), from one session: its service models load once."""
        session = self.session

        def factory(service: str) -> Any:
            client = session.client(service, region_name="us-east-1")
            if service == "ec2":
                return Ec2WithPlacementGroups(client, self.placement, self.calls)
            if service == "batch":
                return BatchCompat(client, self.raw_ec2, self.calls, self.added, self.live)
            return client

        return Clients("us-east-1", factory=factory)

    def _record(self, model: Any, params: dict, **_: Any) -> None:
        op = model.name
        if op in self.fail:
            raise self.fail[op]
        self.calls.append((model.service_model.endpoint_prefix, op, json.loads(json.dumps(params, default=str))))

    def mutations(self) -> list[tuple[str, str, dict]]:
        return [c for c in self.calls if not c[1].startswith(READS)]

    def requests(self, op: str) -> list[dict]:
        return [p for _, o, p in self.calls if o == op]

    def leftovers(self) -> list[str]:
        """Everything of stoker's (by name or tag) still in moto, in every service."""
        a, out = self.aws, []
        out += [c["computeEnvironmentName"] for c in a.client("batch").describe_compute_environments()[
            "computeEnvironments"]]
        out += [q["jobQueueName"] for q in a.client("batch").describe_job_queues()["jobQueues"]]
        ec2 = a.client("ec2")
        out += [t["LaunchTemplateName"] for t in ec2.describe_launch_templates()["LaunchTemplates"]]
        out += list(self.placement.groups)
        out += [g["GroupName"] for g in ec2.describe_security_groups(
            Filters=[{"Name": "tag:stoker:managed", "Values": ["true"]}])["SecurityGroups"]]
        iam = a.client("iam")
        out += [r["RoleName"] for r in iam.list_roles()["Roles"] if r["RoleName"].startswith("stoker")]
        out += [p["InstanceProfileName"] for p in iam.list_instance_profiles()["InstanceProfiles"]]
        out += [r["repositoryName"] for r in a.client("ecr").describe_repositories()["repositories"]]
        out += [b["Name"] for b in a.client("s3").list_buckets()["Buckets"]]
        out += [s["Name"] for s in a.client("secretsmanager").list_secrets()["SecretList"]]  # not those deleted
        return out


@pytest.fixture()
def loop(aws, tmp_path, monkeypatch):
    """moto as it is (enough for plans and for what fails before any change)."""
    monkeypatch.setenv("STOKER_KEY_DIR", str(tmp_path / "keys"))  # apply points this machine at the key secret
    return Loopback(aws)


@pytest.fixture()
def full(aws, tmp_path, monkeypatch):
    """moto with AWS's managed policies (the instance role attaches AmazonEC2ContainerServiceforEC2Role)."""
    monkeypatch.setenv("STOKER_KEY_DIR", str(tmp_path / "keys"))
    monkeypatch.setenv("MOTO_IAM_LOAD_MANAGED_POLICIES", "true")  # the server runs in this process
    urllib.request.urlopen(urllib.request.Request(f"{aws.endpoint}/moto-api/reset", method="POST"))
    return Loopback(aws)


def config(loop: Loopback, **kw: Any) -> InfraConfig:
    return InfraConfig(**{"region": "us-east-1", "subnets": [loop.subnet], "bucket": "stoker-test-bucket", **kw})


def _backend_uses_the_outputs(loop, outputs) -> None:
    """A Batch backend given nothing submits to what `stoker infra apply` made: its queue, image, role and
    instance types, and its checks pass against the queue it created."""
    from stoker.backends.aws.backend import BatchBackend
    from stoker.backends.aws.client import BatchClient
    from tests.unit.backends.test_aws_render import batch, make_unit

    b = BatchBackend(client=BatchClient("us-east-1", batch=loop.aws.client("batch"), logs=loop.aws.client("logs")))
    o = b.options
    assert (o.queue, o.image, o.job_role, o.instance_types) == (
        outputs["queue"], outputs["image"], outputs["job_role_arn"], outputs["instance_types"])
    unit = make_unit("gang", 4, options=batch(trainium=16, efa=8, memory=480000))
    b.check(unit)
    container = b.materialize(unit).payload["definition"]["nodeProperties"]["nodeRangeProperties"][0]["container"]
    assert container["jobRoleArn"] == outputs["job_role_arn"] and container["image"] == outputs["image"]


def test_apply_twice_then_destroy_leaves_nothing(full):
    loop = full
    cfg = config(loop)
    # plan reads only
    the_plan = make_plan(cfg, loop.clients())
    assert [c.action for c in the_plan.changes] == ["create"] * 12
    assert loop.mutations() == [] and not state_path("stoker").exists()

    first = apply(cfg, loop.clients())
    assert len(first.created) == 12 and not first.updated
    # the launch template: 8 EFA interfaces for trn1.32xlarge (checked against botocore's model by boto3)
    (lt,) = loop.requests("CreateLaunchTemplate")
    nics = lt["LaunchTemplateData"]["NetworkInterfaces"]
    assert len(nics) == 8 and {n["InterfaceType"] for n in nics} == {"efa"}
    assert [n["DeviceIndex"] for n in nics] == [0] + [1] * 7
    assert lt["LaunchTemplateData"]["MetadataOptions"]["HttpTokens"] == "required"
    (ce,) = loop.requests("CreateComputeEnvironment*")
    res = ce["computeResources"]
    assert "securityGroupIds" not in res and res["placementGroup"] == "stoker-cluster"
    ami = loop.aws.client("ssm").get_parameter(
        Name="/aws/service/ecs/optimized-ami/amazon-linux-2023/neuron/recommended/image_id")["Parameter"]["Value"]
    assert res["ec2Configuration"] == [{"imageType": "ECS_AL2023", "imageIdOverride": ami}]
    assert res["instanceRole"].endswith("instance-profile/stoker-instance-profile") and res["minvCpus"] == 0
    assert ce["serviceRole"].startswith("arn:aws:iam::123456789012:role/aws-service-role/batch.amazonaws.com/")
    assert not loop.requests("CreateRole") or all(
        {"Key": "stoker:infra", "Value": "stoker"} in r["Tags"] for r in loop.requests("CreateRole"))
    for op in ("CreateLaunchTemplate", "CreateSecurityGroup", "CreatePlacementGroup"):
        (req,) = loop.requests(op)
        assert {"Key": "stoker:infra", "Value": "stoker"} in req["TagSpecifications"][0]["Tags"]
    (sg,) = loop.aws.client("ec2").describe_security_groups(
        Filters=[{"Name": "group-name", "Values": ["stoker-efa"]}])["SecurityGroups"]
    assert any(p["IpProtocol"] == "-1" and p["UserIdGroupPairs"][0]["GroupId"] == sg["GroupId"]
               for p in sg["IpPermissions"])

    outputs = load_outputs()
    assert set(outputs) == set(OUTPUT_KEYS) and outputs == first.outputs
    assert outputs["queue"] == "stoker-queue" and outputs["store_url"] == "s3://stoker-test-bucket/stoker"
    # no image before `stoker image build --push` records the pushed digest; never the mutable `:latest`
    repo = "123456789012.dkr.ecr.us-east-1.amazonaws.com/stoker"
    assert outputs["image"] is None and outputs["ecr_repository_uri"] == repo
    digest = f"{repo}@sha256:" + "ab" * 32
    assert record_image(digest, repo) == "stoker"
    outputs = load_outputs()
    assert outputs["image"] == digest
    assert outputs["job_role_arn"] == "arn:aws:iam::123456789012:role/stoker-job-role"
    _backend_uses_the_outputs(loop, outputs)
    state = State.load("stoker")
    assert all(state.created(k) for k in state.resources if k != "service_role")
    assert not state.created("service_role")  # Batch's, never deleted

    # the second apply: reads only
    loop.calls.clear()
    lines: list[str] = []
    second = apply(cfg, loop.clients(), report=lines.append)
    assert loop.mutations() == [], loop.mutations()
    assert not second.created and not second.updated and "no changes" in lines[-1]
    assert second.plan.summary() == "no changes"
    assert second.outputs == outputs  # the recorded digest stays the image

    # the state lost: resources are found again by name and tag, nothing is created
    state_path("stoker").unlink()
    loop.calls.clear()
    apply(cfg, loop.clients())
    # ... but the pushed digest was only in the state: it is forgotten until the next push
    assert loop.mutations() == [] and load_outputs() == {**outputs, "image": None}

    rows, _ = infra_status(cfg, clients=loop.clients())
    assert {r.owner for r in rows if r.kind != "Batch service-linked role"} == {"stoker"}

    loop.calls.clear()
    gone = destroy(name="stoker", clients=loop.clients())  # from the state alone
    order = [(o, p.get("state")) for _, o, p in loop.mutations()]
    assert order == [("UpdateJobQueue", "DISABLED"), ("DeleteJobQueue", None),
                     ("UpdateComputeEnvironment", "DISABLED"), ("DeleteComputeEnvironment", None),
                     ("DeleteLaunchTemplate", None), ("DeletePlacementGroup", None),
                     ("RemoveRoleFromInstanceProfile", None), ("DeleteInstanceProfile", None),
                     ("DeleteRolePolicy", None), ("DeleteRole", None),  # job role
                     ("DetachRolePolicy", None), ("DeleteRole", None),  # instance role: no inline policy
                     ("DeleteSecurityGroup", None), ("DeleteRepository", None)], order
    assert gone.kept == [f"Secrets Manager secret {SECRET}", "S3 bucket stoker-test-bucket"]  # the store's key
    # waits: the queue and the compute environment were seen DISABLED before their deletion
    names = [o for _, o, _ in loop.calls]
    assert names.index("DescribeJobQueues", names.index("UpdateJobQueue")) < names.index("DeleteJobQueue")
    assert (names.index("DescribeComputeEnvironments", names.index("UpdateComputeEnvironment"))
            < names.index("DeleteComputeEnvironment"))
    assert loop.leftovers() == ["stoker-test-bucket", SECRET]
    assert list(State.load("stoker").resources) == ["bucket", "store_key_secret"] and load_outputs() is None

    destroy(cfg, clients=loop.clients(), delete_bucket=True)
    assert loop.leftovers() == [] and not state_path("stoker").exists()


def test_policies_stoker_creates_pass_the_least_privilege_check(full):
    loop = full
    apply(config(loop), loop.clients())
    iam = loop.aws.client("iam")
    docs = []
    for role in ("stoker-instance-role", "stoker-job-role"):
        for name in iam.list_role_policies(RoleName=role)["PolicyNames"]:
            docs.append(iam.get_role_policy(RoleName=role, PolicyName=name)["PolicyDocument"])
        for p in iam.list_attached_role_policies(RoleName=role)["AttachedPolicies"]:
            pol = iam.get_policy(PolicyArn=p["PolicyArn"])["Policy"]
            docs.append(iam.get_policy_version(PolicyArn=pol["Arn"], VersionId=pol["DefaultVersionId"])[
                "PolicyVersion"]["Document"])
    assert len(docs) == 2  # job: store; instance: AmazonEC2ContainerServiceforEC2Role, nothing inline
    for doc in docs:
        assert check_least_privilege(doc) == [], doc
    # why the instance role needs no ECR grant of its own: AWS's policy allows the pulls on every repository
    assert iam.list_role_policies(RoleName="stoker-instance-role")["PolicyNames"] == []
    (ecs,) = [d["Statement"][0] for d in docs if "ecs:Poll" in json.dumps(d)]
    assert ecs["Resource"] == "*" and {"ecr:GetAuthorizationToken", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer",
                                       "ecr:BatchCheckLayerAvailability"} <= set(ecs["Action"])
    job = iam.get_role_policy(RoleName="stoker-job-role", PolicyName="stoker-store")["PolicyDocument"]
    resources = json.dumps([s["Resource"] for s in job["Statement"]])
    assert "arn:aws:s3:::stoker-test-bucket/stoker/*" in resources and "s3:::*" not in resources


def test_changes_are_planned_then_applied_as_updates(full):
    loop = full
    apply(config(loop), loop.clients())
    cfg = config(loop, max_vcpus=1024, root_volume_gb=800)
    the_plan = make_plan(cfg, loop.clients())
    by_key = {c.resource.key: c for c in the_plan.changes}
    assert by_key["launch_template"].action == "update"
    assert any("VolumeSize: 500 -> 800" in d for d in by_key["launch_template"].diffs)
    ce = by_key["compute_environment"]
    assert ce.action == "update" and "maxvCpus: 512 -> 1024" in ce.diffs
    assert {c.action for k, c in by_key.items() if k not in ("launch_template", "compute_environment")} <= {
        "ok", "use"}
    loop.calls.clear()
    result = apply(cfg, loop.clients())
    assert result.updated == ["launch template stoker-lt", "compute environment stoker-ce"]
    assert [o for _, o, _ in loop.mutations()] == ["CreateLaunchTemplateVersion", "ModifyLaunchTemplate",
                                                   "UpdateComputeEnvironment"]
    (update,) = loop.requests("UpdateComputeEnvironment")
    # moto ignores computeResources here: the request is what is checked (boto3 validated it)
    assert update["computeResources"] == {"maxvCpus": 1024, "launchTemplate": {
        "launchTemplateId": update["computeResources"]["launchTemplate"]["launchTemplateId"], "version": "2"}}
    (version,) = loop.requests("CreateLaunchTemplateVersion")
    assert version["LaunchTemplateData"]["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == 800
    destroy(cfg, clients=loop.clients(), delete_bucket=True)
    assert loop.leftovers() == []


@pytest.mark.parametrize("kw, words", [
    ({"subnets": ["subnet-0000000000000000f"]}, ["subnets", "subnet-0000000000000000f", "describe-subnets"]),
    ({"ami": "ssm:/no/such/parameter"}, ["ami = 'ssm:/no/such/parameter'", "no such SSM parameter"]),
    ({"security_group": "sg-0000000000000000f"}, ["security_group", "not found"]),
])
def test_what_aws_refuses_fails_the_plan_and_creates_nothing(loop, kw, words):
    with pytest.raises(ConfigError) as e:
        apply(config(loop, **kw), loop.clients())
    for w in words:
        assert w in str(e.value)
    assert loop.mutations() == [] and loop.leftovers() == []


def test_subnets_in_several_zones_refused_with_a_placement_group(loop):
    two = [loop.subnets["us-east-1a"], loop.subnets["us-east-1b"]]
    with pytest.raises(ConfigError, match="span us-east-1a, us-east-1b.*one Availability Zone.*placement_group"):
        make_plan(config(loop, subnets=two), loop.clients())
    p = make_plan(config(loop, subnets=two, placement_group=False), loop.clients())
    assert any("different zones" in w for w in p.ctx.warnings)
    assert loop.mutations() == []


@pytest.mark.parametrize("op, resource, recorded", [
    ("CreateJobQueue", "job queue stoker-queue", "compute_environment"),
    ("PutBucketTagging", "S3 bucket stoker-test-bucket", "bucket"),  # created, not yet tagged
    ("AttachRolePolicy", "IAM role stoker-instance-role", "instance_role"),
])
def test_failure_half_way_is_recorded_and_destroy_cleans_it(full, op, resource, recorded):
    from botocore.exceptions import ClientError

    loop = full
    loop.fail[op] = ClientError({"Error": {"Code": "LimitExceededException", "Message": "too many"}}, op)
    with pytest.raises(BackendError) as e:
        apply(config(loop), loop.clients())
    msg = str(e.value)
    service = {"CreateJobQueue": "batch", "PutBucketTagging": "s3", "AttachRolePolicy": "iam"}[op]
    for words in (f"{service}:{op} on {resource} failed: LimitExceededException", "ask for a higher quota",
                  "Created so far", str(state_path("stoker")), "stoker infra destroy"):
        assert words in msg, (words, msg)
    state = State.load("stoker")
    assert state.created(recorded) and state.data["outputs"] is None and load_outputs() is None
    del loop.fail[op]
    destroy(name="stoker", clients=loop.clients(), delete_bucket=True)
    assert loop.leftovers() == [] and not state_path("stoker").exists()


def test_destroy_keeps_a_repository_with_images_unless_forced(full):
    loop = full
    apply(config(loop, instance_types=["c5.4xlarge"], max_vcpus=64, placement_group=False), loop.clients())
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                           "config": {"digest": "sha256:" + "0" * 64, "size": 1, "mediaType":
                                      "application/vnd.docker.container.image.v1+json"}, "layers": []})
    loop.aws.client("ecr").put_image(repositoryName="stoker", imageManifest=manifest, imageTag="latest")
    with pytest.raises(BackendError, match="still holds images.*stoker infra destroy --force") as e:
        destroy(name="stoker", clients=loop.clients())
    assert "deleted so far: job queue stoker-queue, compute environment stoker-ce" in str(e.value)
    assert set(State.load("stoker").resources) == {"bucket", "store_key_secret", "ecr_repository",
                                                   "service_role"}  # what is left
    destroy(name="stoker", clients=loop.clients(), force=True)
    assert loop.leftovers() == ["stoker-test-bucket", SECRET]


def test_resources_in_the_way_and_existing_ones(full):
    loop = full
    s3 = loop.aws.client("s3")
    s3.create_bucket(Bucket="their-bucket")
    ec2 = loop.aws.client("ec2")
    vpc = ec2.describe_subnets(SubnetIds=[loop.subnet])["Subnets"][0]["VpcId"]
    sg = ec2.create_security_group(GroupName="theirs", Description="no EFA rule", VpcId=vpc)["GroupId"]
    loop.aws.client("ecr").create_repository(repositoryName="their-repo")
    cfg = config(loop, bucket="their-bucket", security_group=sg, ecr_repository="their-repo")
    the_plan = make_plan(cfg, loop.clients())
    used = {c.resource.key for c in the_plan.changes if c.action == "use"}
    assert {"bucket", "security_group", "ecr_repository"} <= used
    assert any(sg in w and "self-referencing" in w for w in the_plan.ctx.warnings)

    # a compute environment of the same name that is not stoker's stops apply before any change
    iam = loop.aws.client("iam")
    iam.create_role(RoleName="svc", AssumeRolePolicyDocument="{}")
    prof = iam.create_instance_profile(InstanceProfileName="theirs")["InstanceProfile"]["Arn"]
    loop.aws.client("batch").create_compute_environment(
        computeEnvironmentName="stoker-ce", type="MANAGED", serviceRole="arn:aws:iam::123456789012:role/svc",
        computeResources={"type": "EC2", "minvCpus": 0, "maxvCpus": 4, "instanceTypes": ["c5.xlarge"],
                          "subnets": [loop.subnet], "securityGroupIds": [sg], "instanceRole": prof})
    loop.calls.clear()
    with pytest.raises(ConfigError, match="nothing was changed: compute environment stoker-ce exists without the "
                                          "tag stoker:infra=stoker"):
        apply(cfg, loop.clients())
    assert loop.mutations() == []

    loop.aws.client("batch").delete_compute_environment(computeEnvironment="stoker-ce")
    apply(cfg, loop.clients())
    assert not loop.requests("CreateBucket") and not loop.requests("PutBucketTagging")
    assert not loop.requests("CreateSecurityGroup") and not loop.requests("CreateRepository")
    assert load_outputs()["image"] is None and load_outputs()["ecr_repository_uri"].endswith("/their-repo")
    destroy(cfg, clients=loop.clients(), delete_bucket=True, force=True)
    # theirs stay: bucket, security group, repository
    assert s3.head_bucket(Bucket="their-bucket")
    assert ec2.describe_security_groups(GroupIds=[sg])["SecurityGroups"]
    assert loop.aws.client("ecr").describe_repositories(repositoryNames=["their-repo"])["repositories"]
    assert not [r for r in iam.list_roles()["Roles"] if r["RoleName"].startswith("stoker")]


def _submit(loop: Loopback, name: str, flow: str | None = None, run: str | None = None) -> str:
    batch = loop.aws.client("batch")
    if not batch.describe_job_definitions(jobDefinitionName="hello", status="ACTIVE")["jobDefinitions"]:
        batch.register_job_definition(jobDefinitionName="hello", type="container", containerProperties={
            "image": "busybox", "command": ["true"], "resourceRequirements": [
                {"type": "VCPU", "value": "1"}, {"type": "MEMORY", "value": "128"}]})
    tags = {"stoker:flow": flow, "stoker:run": run} if flow else {}
    return batch.submit_job(jobName=name, jobQueue="stoker-queue", jobDefinition="hello", tags=tags)["jobId"]


def test_destroy_refuses_while_jobs_run_and_changes_nothing(full):
    """Deleting a job queue terminates every job in it: destroy names the jobs that have not ended and how to stop
    them, and changes nothing; `terminate_jobs` terminates them and destroys the rest."""
    loop = full
    cfg = config(loop, instance_types=["c5.4xlarge"], max_vcpus=64, placement_group=False)
    apply(cfg, loop.clients())
    train = _submit(loop, "Pretrain-17-train-2-a1", "Pretrain", "17")
    rank = _submit(loop, "Pretrain-17-eval-3-a1", "Pretrain", "17")
    theirs = _submit(loop, "their-job")
    done = _submit(loop, "Pretrain-16-start-1-a1", "Pretrain", "16")  # ended: not in the way
    loop.live.update({train: "RUNNING", rank: "RUNNABLE", theirs: "SUBMITTED"})
    before = state_path("stoker").read_text()
    loop.calls.clear()
    with pytest.raises(ConfigError) as e:
        destroy(name="stoker", clients=loop.clients())
    msg = str(e.value)
    for words in ("job queue stoker-queue holds 3 jobs that have not ended",
                  "deleting the queue terminates every job in it",
                  f"{train} (Pretrain-17-train-2-a1, RUNNING)", f"{rank} (Pretrain-17-eval-3-a1, RUNNABLE)",
                  f"{theirs} (their-job, SUBMITTED)", "Nothing was changed", "`stoker kill Pretrain/17`",
                  "aws batch terminate-job", "or wait until they end", "--terminate-jobs"):
        assert words in msg, (words, msg)
    assert done not in msg and "Pretrain/16" not in msg
    # every status asked, every page read (one job per page here)
    statuses = {p["jobStatus"] for p in loop.requests("ListJobs*")}
    assert statuses == {"SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING"}
    loop.live.update({rank: "RUNNING"})  # two on one status: two pages
    loop.calls.clear()
    with pytest.raises(ConfigError, match="holds 3 jobs"):
        destroy(name="stoker", clients=loop.clients())
    running = [p for p in loop.requests("ListJobs*") if p["jobStatus"] == "RUNNING"]
    assert [p.get("nextToken") for p in running] == [None, "1"]
    assert loop.mutations() == [] and state_path("stoker").read_text() == before
    assert "stoker-queue" in loop.leftovers() and "stoker-ce" in loop.leftovers()

    loop.calls.clear()
    lines: list[str] = []
    gone = destroy(name="stoker", clients=loop.clients(), terminate_jobs=True, report=lines.append)
    assert "- terminating 3 jobs of job queue stoker-queue" in lines[0]
    ops = [o for _, o, _ in loop.mutations()]
    assert ops[:4] == ["TerminateJob"] * 3 + ["UpdateJobQueue"]
    assert {p["jobId"] for p in loop.requests("TerminateJob")} == {train, rank, theirs}
    assert all("stoker infra destroy --terminate-jobs" in p["reason"] for p in loop.requests("TerminateJob"))
    assert "job queue stoker-queue" in gone.deleted and loop.leftovers() == ["stoker-test-bucket", SECRET]


def test_destroy_without_jobs_in_the_way_terminates_nothing(full):
    loop = full
    apply(config(loop, instance_types=["c5.4xlarge"], max_vcpus=64, placement_group=False), loop.clients())
    _submit(loop, "Pretrain-16-start-1-a1", "Pretrain", "16")  # moto's jobs end at once
    loop.calls.clear()
    destroy(name="stoker", clients=loop.clients())
    assert not loop.requests("TerminateJob") and loop.leftovers() == ["stoker-test-bucket", SECRET]


def test_default_security_group_checked_for_multi_node_jobs(loop):
    """With EFA the compute environment names no security group, so Batch gives the nodes' awsvpc interfaces the
    VPC's default group: plan says when it would keep the nodes of a gang apart, with the commands that fix it."""
    ec2 = loop.aws.client("ec2")
    vpc = ec2.describe_subnets(SubnetIds=[loop.subnet])["Subnets"][0]["VpcId"]
    (default,) = ec2.describe_security_groups(Filters=[{"Name": "vpc-id", "Values": [vpc]},
                                                       {"Name": "group-name", "Values": ["default"]}])["SecurityGroups"]
    sg = default["GroupId"]

    def warned() -> list[str]:
        return [w for w in make_plan(config(loop), loop.clients()).ctx.warnings if "default security group" in w]

    # moto's default group has no ingress rule (AWS's has the self rule, but many accounts strip it)
    (w,) = warned()
    ingress = (f"aws ec2 authorize-security-group-ingress --region us-east-1 --group-id {sg} "
               f"--ip-permissions 'IpProtocol=-1,UserIdGroupPairs=[{{GroupId={sg}}}]'")
    assert sg in w and vpc in w and "all traffic from itself" in w and f"`{ingress}`" in w
    assert "all traffic out" not in w
    ec2.authorize_security_group_ingress(GroupId=sg, IpPermissions=[
        {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": sg}]}])  # what the command does
    assert warned() == []
    ec2.revoke_security_group_egress(GroupId=sg, IpPermissions=[
        {"IpProtocol": "-1", "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}])
    (w,) = warned()
    assert "all traffic out" in w and "all traffic from itself" not in w
    assert (f"`aws ec2 authorize-security-group-egress --region us-east-1 --group-id {sg} "
            "--ip-permissions 'IpProtocol=-1,IpRanges=[{CidrIp=0.0.0.0/0}]'`") in w
    # without EFA the compute environment names stoker's group, which the task interfaces get: no check
    plain = make_plan(config(loop, instance_types=["c5.4xlarge"], max_vcpus=64, placement_group=False),
                      loop.clients())
    assert not [w for w in plain.ctx.warnings if "default security group" in w]
    assert loop.mutations() == []


def test_spot_is_single_node_only(full):
    loop = full
    # with a placement group or EFA: plan and apply refuse before any AWS call
    for run in (make_plan, apply):
        with pytest.raises(ConfigError, match="spot = true: AWS Batch does not run multi-node parallel jobs"):
            run(config(loop, spot=True), loop.clients())
    assert loop.calls == [] and not state_path("stoker").exists()
    # without: planned, with a word on what the queue can run
    single = config(loop, spot=True, instance_types=["c5.4xlarge"], max_vcpus=64, placement_group=False)
    p = make_plan(single, loop.clients())
    assert any("single-node jobs only" in w for w in p.ctx.warnings)
    # an infra applied before the rule (its state says spot with a placement group) can still be destroyed
    apply(single, loop.clients())
    state = State.load("stoker")
    state.data["config"].update(spot=True, placement_group=True)
    state.save()
    destroy(name="stoker", clients=loop.clients(), delete_bucket=True)
    assert loop.leftovers() == []


def test_instance_role_loses_the_inline_ecr_grant_earlier_versions_added(full):
    loop = full
    cfg = config(loop, instance_types=["c5.4xlarge"], max_vcpus=64, placement_group=False)
    apply(cfg, loop.clients())
    iam = loop.aws.client("iam")
    iam.put_role_policy(RoleName="stoker-instance-role", PolicyName="stoker-ecr-pull", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "ecr:BatchGetImage",
                                                 "Resource": "arn:aws:ecr:us-east-1:123456789012:repository/stoker"}]}))
    change = {c.resource.key: c for c in make_plan(cfg, loop.clients()).changes}["instance_role"]
    assert change.action == "update" and change.diffs == ["inline policy stoker-ecr-pull: remove (not in the plan)"]
    apply(cfg, loop.clients())
    assert iam.list_role_policies(RoleName="stoker-instance-role")["PolicyNames"] == []
    destroy(cfg, clients=loop.clients(), delete_bucket=True)


def _cli(*argv: str) -> int:
    import argparse

    from stoker.cli.errors import run_cli
    from stoker.cli.infra import register

    ap = argparse.ArgumentParser(prog="stoker")
    register(ap.add_subparsers(dest="command", required=True))
    args = ap.parse_args(list(argv))
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: args.fn(args))
    return e.value.code


def test_cli_init_plan_apply_status_destroy(full, tmp_path, capsys, monkeypatch):
    loop = full
    monkeypatch.chdir(tmp_path)
    assert _cli("infra", "init") == 0
    path = Path("stoker-infra.toml")
    assert _cli("infra", "init") == 1 and "exists" in capsys.readouterr().err
    # a CPU type without EFA and no placement group: what moto's own Batch and EC2 serve without stand-ins
    text = (path.read_text().replace("subnet-0123456789abcdef0", loop.subnet)
            .replace('"trn1.32xlarge"]', '"c5.4xlarge"]').replace("max_vcpus = 512", "max_vcpus = 64")
            .replace("placement_group = true", "placement_group = false"))
    path.write_text(text)
    capsys.readouterr()
    assert _cli("infra", "plan") == 0
    out = capsys.readouterr().out
    assert "11 to create" in out and "stoker-ce" in out and "Secrets Manager secret" in out
    assert _cli("infra", "apply") == 0
    assert "applied: 11 created" in capsys.readouterr().out
    assert _cli("infra", "apply") == 0
    assert "no changes" in capsys.readouterr().out
    assert _cli("infra", "status", "--json") == 0
    status = json.loads(capsys.readouterr().out)
    assert status["outputs"]["queue"] == "stoker-queue" and status["outputs"]["placement_group"] is None
    assert {r["owner"] for r in status["resources"] if r["name"].startswith("stoker")} == {"stoker"}
    assert _cli("infra", "destroy") == 1  # not a terminal: asks for --yes
    assert "--yes" in capsys.readouterr().err
    assert _cli("infra", "destroy", "--yes", "--delete-bucket", "--terminate-jobs") == 0  # no jobs to terminate
    assert "destroyed 10 resources" in capsys.readouterr().out
    assert loop.leftovers() == []


def test_cli_bad_config_one_message_nothing_created(loop, tmp_path, capsys):
    bad = tmp_path / "infra.toml"
    bad.write_text('name = "stoker"\nbucket = "stoker-test-bucket"\ninstance_types = ["trn1.32xlarge"]\n')
    assert _cli("infra", "apply", "--config", str(bad)) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: subnets is missing in ") and "Traceback" not in err
    bad.write_text('subnets = ["' + loop.subnet + '"]\nbucket = "b-b-b"\ninstance_types = ["trn1.mega"]\n')
    assert _cli("infra", "plan", "--config", str(bad)) == 1
    assert "trn1.mega" in capsys.readouterr().err
    bad.write_text("subnets = [\n")
    assert _cli("infra", "apply", "--config", str(bad)) == 1
    assert "not valid TOML" in capsys.readouterr().err
    assert loop.calls == [] and loop.leftovers() == [] and not state_path("stoker").exists()
