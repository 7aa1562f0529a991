"""`stoker infra` without AWS: the TOML's validation, the request payloads (checked against botocore's service
model and golden files, regenerate with STOKER_UPDATE_GOLDEN=1), the IAM documents' least privilege, the state
file's outputs, and waits that time out with a message."""

from __future__ import annotations

import base64
import email
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from stoker.backends.aws.infra import (
    check_least_privilege,
    instance_role_policies,
    job_role_policy,
    load_outputs,
)
from stoker.backends.aws.infra.base import Clients, Context
from stoker.backends.aws.infra.config import TEMPLATE, InfraConfig, from_dict, load_config
from stoker.backends.aws.infra.policies import normalized, trust_policy
from stoker.backends.aws.infra.spec import (
    Facts,
    compute_environment_request,
    job_queue_request,
    launch_template_data,
    subset_diff,
    user_data,
)
from stoker.backends.aws.infra.state import OUTPUT_KEYS, State
from stoker.errors import BackendError, ConfigError

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "aws_infra"
SUBNET = "subnet-0123456789abcdef0"


def cfg(**kw) -> InfraConfig:
    return InfraConfig(**{"subnets": [SUBNET], "bucket": "my-stoker-bucket", "region": "us-east-1", **kw})


def facts() -> Facts:
    return Facts(region="us-east-1", account="123456789012", ami="ami-0123456789abcdef0",
                 security_group="sg-0123456789abcdef0",
                 instance_profile_arn="arn:aws:iam::123456789012:instance-profile/stoker-instance-profile",
                 service_role_arn="arn:aws:iam::123456789012:role/aws-service-role/batch.amazonaws.com/"
                                  "AWSServiceRoleForBatch",
                 launch_template_id="lt-0123456789abcdef0", launch_template_version="1",
                 compute_environment_arn="arn:aws:batch:us-east-1:123456789012:compute-environment/stoker-ce")


def validate(service: str, op: str, params: dict) -> None:
    """Raise when `params` is not a valid `op` request in botocore's model of `service`."""
    botocore_session = pytest.importorskip("botocore.session")
    from botocore.validate import validate_parameters

    model = botocore_session.get_session().get_service_model(service)
    validate_parameters(params, model.operation_model(op).input_shape)


# -- the TOML ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, words", [
    ({"subnets": []}, ["subnets is missing", "subnet-"]),
    ({"instance_types": ["trn9.huge"]}, ["trn9.huge", "does not know", "trn1.32xlarge"]),
    ({"instance_types": ["trn1.32xlarge", "p5.48xlarge"]}, ["mixes Neuron", "GPU"]),
    ({"instance_types": ["trn1.32xlarge", "trn1n.32xlarge"]}, ["EFA network cards", "trn1.32xlarge: 8",
                                                               "efa = false"]),
    ({"max_vcpus": 64}, ["max_vcpus = 64", "128 vCPUs", "512"]),
    ({"min_vcpus": 600}, ["min_vcpus", "must not exceed max_vcpus"]),
    ({"bucket": ""}, ["bucket is missing"]),
    ({"bucket": "My_Bucket"}, ["bucket = 'My_Bucket'", "lowercase"]),
    ({"subnets": ["sn-1"]}, ["subnets = 'sn-1'", "subnet-0123456789abcdef0"]),
    ({"security_group": "default"}, ["security_group", "sg-"]),
    ({"ami": "amazon-linux"}, ["ami = 'amazon-linux'", "ssm:/"]),
    ({"root_volume_gb": 8}, ["root_volume_gb", "between 30"]),
    ({"spot": "yes"}, ["spot = 'yes'", "must be a bool"]),
    ({"name": "my stoker"}, ["name = 'my stoker'", "letters"]),
])
def test_config_errors_name_the_key_and_the_fix(kw, words):
    with pytest.raises(ConfigError) as e:
        cfg(**kw)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


@pytest.mark.parametrize("kw, words", [
    ({}, ["spot = true", "multi-node parallel jobs", "Spot", "placement_group and efa = true", "set spot = false",
          "placement_group = false and efa = false"]),
    ({"placement_group": False}, ["spot = true", ", and efa = true is there"]),
    ({"instance_types": ["c5.4xlarge"], "max_vcpus": 64}, ["spot = true", ", and placement_group = true is there"]),
])
def test_spot_refused_where_the_infra_is_made_for_multi_node_jobs(kw, words):
    """Batch runs no multi-node parallel job on Spot: plan and apply refuse it (loading does not, so that an infra
    applied before the rule can still be destroyed)."""
    c = cfg(spot=True, **kw)
    with pytest.raises(ConfigError) as e:
        c.check_creatable()
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    cfg(spot=True, instance_types=["c5.4xlarge"], max_vcpus=64, placement_group=False).check_creatable()
    cfg(spot=True, placement_group=False, efa=False).check_creatable()
    cfg().check_creatable()


def test_config_defaults_follow_the_instance_types():
    trn = cfg()
    assert trn.kind == "neuron" and trn.efa_interfaces == 8 and "neuron" in trn.ami_source
    assert trn.store_url == "s3://my-stoker-bucket/stoker"
    gpu = cfg(instance_types=["p5.48xlarge"], max_vcpus=768)
    assert gpu.kind == "gpu" and gpu.efa_interfaces == 32 and "/gpu/" in gpu.ami_source
    cpu = cfg(instance_types=["c5.4xlarge"], max_vcpus=64)
    assert cpu.kind == "cpu" and cpu.efa_interfaces == 0 and "/recommended/image_id" in cpu.ami_source
    assert cfg(efa=False).efa_interfaces == 0
    assert cfg(prefix="/runs/").prefix == "runs"


def test_unknown_key_suggests_the_right_one():
    with pytest.raises(ConfigError, match="unknown key 'subnet'.*did you mean 'subnets'"):
        from_dict({"subnet": [SUBNET], "bucket": "b-b-b"}, source="infra.toml")


def test_load_config_bad_toml_and_missing_file(tmp_path):
    bad = tmp_path / "infra.toml"
    bad.write_text('name = "stoker"\nsubnets = [subnet-1]\n')
    with pytest.raises(ConfigError, match=r"infra.toml: not valid TOML.*line 2"):
        load_config(bad)
    with pytest.raises(ConfigError, match="no infra config at .*stoker infra init"):
        load_config(tmp_path / "nope.toml")


def test_template_loads_and_its_example_is_valid(tmp_path):
    path = tmp_path / "stoker-infra.toml"
    path.write_text(TEMPLATE.format(path=path))
    c = load_config(path)
    assert c.instance_types == ["trn1.32xlarge"] and c.placement_group and c.max_vcpus == 512
    example = Path(__file__).resolve().parents[3] / "examples" / "aws" / "infra.toml"
    assert load_config(example).name


# -- request payloads ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("itype, vcpus, cards", [("trn1.32xlarge", 512, 8), ("trn1n.32xlarge", 512, 16),
                                                 ("p5.48xlarge", 768, 32), ("c5.4xlarge", 64, 0)])
def test_launch_template_has_one_efa_interface_per_network_card(itype, vcpus, cards):
    c = cfg(instance_types=[itype], max_vcpus=vcpus)
    data = launch_template_data(c, facts())
    validate("ec2", "CreateLaunchTemplate", {"LaunchTemplateName": "stoker-lt", "LaunchTemplateData": data})
    nics = data.get("NetworkInterfaces", [])
    assert len(nics) == cards
    assert [n["NetworkCardIndex"] for n in nics] == list(range(cards))
    assert [n["DeviceIndex"] for n in nics] == [0] + [1] * (cards - 1) if cards else True
    assert all(n["InterfaceType"] == "efa" and n["Groups"] == ["sg-0123456789abcdef0"] for n in nics)
    assert data["MetadataOptions"] == {"HttpTokens": "required", "HttpPutResponseHopLimit": 1,
                                       "HttpEndpoint": "enabled"}
    assert data["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == 500
    assert data["BlockDeviceMappings"][0]["Ebs"]["VolumeType"] == "gp3"
    ce = compute_environment_request(c, facts())
    validate("batch", "CreateComputeEnvironment", ce)
    res = ce["computeResources"]
    # Batch refuses security groups on the compute environment when the launch template has interfaces
    assert ("securityGroupIds" in res) == (cards == 0)
    assert res["placementGroup"] == "stoker-cluster" and res["minvCpus"] == 0
    assert res["launchTemplate"] == {"launchTemplateId": "lt-0123456789abcdef0", "version": "1"}
    assert res["allocationStrategy"] == "BEST_FIT_PROGRESSIVE"
    assert ce["tags"]["stoker:infra"] == "stoker" and ce["state"] == "ENABLED"
    validate("batch", "CreateJobQueue", job_queue_request(c, facts()))


def test_compute_environment_image_type_spot_and_no_placement_group():
    gpu = compute_environment_request(cfg(instance_types=["p4d.24xlarge"], max_vcpus=384, spot=True,
                                          placement_group=False, efa=False), facts())
    res = gpu["computeResources"]
    assert res["ec2Configuration"] == [{"imageType": "ECS_AL2023_NVIDIA", "imageIdOverride": "ami-0123456789abcdef0"}]
    assert res["type"] == "SPOT" and res["allocationStrategy"] == "SPOT_PRICE_CAPACITY_OPTIMIZED"
    assert "placementGroup" not in res
    validate("batch", "CreateComputeEnvironment", gpu)


def _user_data_text(c: InfraConfig) -> str:
    raw = base64.b64decode(launch_template_data(c, facts())["UserData"]).decode()
    msg = email.message_from_string(raw)
    assert msg.is_multipart(), "Batch needs MIME multipart user data in a launch template"
    parts = msg.get_payload()
    assert [p.get_content_type() for p in parts] == ["text/x-shellscript"]
    return parts[0].get_payload()


@pytest.mark.parametrize("itype, vcpus", [("trn1.32xlarge", 512), ("c5.4xlarge", 64)])
def test_containers_get_no_instance_metadata(itype, vcpus):
    """Hop limit 1 (a container one hop away gets no IMDSv2 token), and the ECS agent blocks IMDS for awsvpc
    containers (multi-node jobs) and hands them the job role: nothing in a container reaches the instance role."""
    c = cfg(instance_types=[itype], max_vcpus=vcpus)
    meta = launch_template_data(c, facts())["MetadataOptions"]
    assert meta["HttpPutResponseHopLimit"] == 1 and meta["HttpTokens"] == "required"
    script = _user_data_text(c)
    # appended, never overwritten: Batch's own user data part writes ECS_CLUSTER to the same file
    assert ("cat >> /etc/ecs/ecs.config <<'EOF'\nECS_AWSVPC_BLOCK_IMDS=true\nECS_ENABLE_TASK_IAM_ROLE=true\nEOF"
            in script)
    assert "> /etc/ecs/ecs.config" not in script.replace(">> /etc/ecs/ecs.config", "")


def test_open_egress_and_self_rule():
    from stoker.backends.aws.infra.spec import has_open_egress, has_self_rule

    assert has_open_egress([{"IpProtocol": "-1", "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}])
    assert not has_open_egress([{"IpProtocol": "tcp", "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}])
    assert not has_open_egress([{"IpProtocol": "-1", "IpRanges": [{"CidrIp": "10.0.0.0/8"}]}])
    assert not has_open_egress([])
    assert has_self_rule([{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": "sg-1"}]}], "sg-1")
    assert not has_self_rule([{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": "sg-2"}]}], "sg-1")


def test_user_data_installs_only_the_drivers_the_types_need():
    trn = _user_data_text(cfg())
    assert "memlock" in trn and "efa_installer.sh" in trn and "aws-neuronx-dkms" in trn
    assert "modinfo neuron" in trn  # the Neuron driver only where the AMI lacks it
    # EFA: never `modinfo efa` (AL2023's in-kernel module has no libfabric); the full installer (not --minimal)
    # unless libfabric's efa provider already sees the devices, then that check again, failing the node loudly
    assert "modinfo efa" not in trn and "--minimal" not in trn
    skip, install, check = (trn.index(s) for s in (
        "if ! /opt/amazon/efa/bin/fi_info -p efa >/dev/null 2>&1; then", "./efa_installer.sh -y)",
        "/opt/amazon/efa/bin/fi_info -p efa || stoker_fail \"EFA:"))
    assert skip < install < check
    assert "aws-efa-installer-1.41.0.tar.gz" in trn  # pinned, as in the gpu images
    fail = trn[trn.index("stoker_fail() {"):trn.index("\n}\n")]
    assert "tee /dev/console" in fail and "systemctl mask --now ecs.service" in fail and "shutdown -h now" in fail
    assert "exit 1" in fail and fail.index("mask") < fail.index("shutdown")
    assert "ls /dev/neuron0 >/dev/null || stoker_fail" in trn
    p5 = _user_data_text(cfg(instance_types=["p5.48xlarge"], max_vcpus=768))
    assert "efa_installer.sh" in p5 and "neuron" not in p5
    cpu = _user_data_text(cfg(instance_types=["c5.4xlarge"], max_vcpus=64))
    assert "memlock" in cpu and "efa_installer" not in cpu and "neuron" not in cpu
    assert "efa_installer" not in _user_data_text(cfg(install_drivers=False))


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize("types, vcpus", [(["trn1.32xlarge"], 512), (["p5.48xlarge"], 768), (["c5.4xlarge"], 64)])
def test_user_data_is_valid_bash(tmp_path, types, vcpus):
    script = tmp_path / "user-data.sh"
    script.write_text(_user_data_text(cfg(instance_types=types, max_vcpus=vcpus)))
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name, itype, vcpus", [("trn1", "trn1.32xlarge", 512), ("cpu", "c5.4xlarge", 64)])
def test_golden_requests(name, itype, vcpus):
    c = cfg(instance_types=[itype], max_vcpus=vcpus)
    data = launch_template_data(c, facts())
    requests = json.dumps({"launch_template_data": {**data, "UserData": f"(base64 of {name}.user-data.txt)"},
                           "compute_environment": compute_environment_request(c, facts()),
                           "job_queue": job_queue_request(c, facts())}, indent=2, sort_keys=True) + "\n"
    assert base64.b64decode(data["UserData"]).decode() == user_data(c)
    for path, text in [(GOLDEN / f"{name}.requests.json", requests), (GOLDEN / f"{name}.user-data.txt", user_data(c))]:
        if os.environ.get("STOKER_UPDATE_GOLDEN") == "1":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        assert path.exists(), f"no golden file {path}: run with STOKER_UPDATE_GOLDEN=1"
        assert text == path.read_text(), f"{path.name} changed; if on purpose, rerun with STOKER_UPDATE_GOLDEN=1"


def test_subset_diff_ignores_what_aws_adds_and_names_what_differs():
    want = {"A": {"B": 1}, "L": [{"x": 1}, {"x": 2}]}
    assert subset_diff(want, {"A": {"B": 1, "extra": 0}, "L": [{"x": 1, "y": 0}, {"x": 2}]}) == []
    assert subset_diff(want, {"A": {"B": 2}, "L": [{"x": 1}]}) == ["A.B: 2 -> 1", "L: 1 entries -> 2 entries"]


# -- IAM ------------------------------------------------------------------------------------------------------------

def test_every_policy_stoker_creates_is_least_privilege():
    job = job_role_policy("my-bucket", "stoker", "/aws/batch/job", region="us-east-1", account="123456789012")
    instance = instance_role_policies()
    # AmazonEC2ContainerServiceforEC2Role already allows the ECR pulls on "*": an inline grant would add nothing
    assert instance == {"managed": ["arn:aws:iam::aws:policy/service-role/AmazonEC2ContainerServiceforEC2Role"],
                        "inline": {}}
    assert instance_role_policies(partition="aws-cn")["managed"][0].startswith("arn:aws-cn:iam::aws:policy/")
    for doc in [job, trust_policy("ec2.amazonaws.com")]:
        assert check_least_privilege(doc) == [], doc
        validate("iam", "PutRolePolicy", {"RoleName": "r", "PolicyName": "p", "PolicyDocument": json.dumps(doc)})
    objects, listing, logs = job["Statement"]
    assert objects["Resource"] == "arn:aws:s3:::my-bucket/stoker/*"  # the store's prefix, nothing else
    arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:stoker/my-bucket/stoker/store-key-AbCdEf"
    keyed = job_role_policy("my-bucket", "stoker", "/aws/batch/job", region="us-east-1", account="123456789012",
                            key_secret_arn=arn)
    assert keyed["Statement"][:3] == job["Statement"] and check_least_privilege(keyed) == []
    assert keyed["Statement"][3] == {"Sid": "StoreKey", "Effect": "Allow", "Action": "secretsmanager:GetSecretValue",
                                     "Resource": arn}  # the store's key secret, and no other
    validate("iam", "PutRolePolicy", {"RoleName": "r", "PolicyName": "p", "PolicyDocument": json.dumps(keyed)})
    assert listing["Resource"] == "arn:aws:s3:::my-bucket"
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["stoker", "stoker/*"]}}
    assert all(r.startswith("arn:aws:logs:us-east-1:123456789012:log-group:/aws/batch/job") for r in logs["Resource"])


@pytest.mark.parametrize("statement, problem", [
    ({"Effect": "Allow", "Action": "*", "Resource": "*"}, "Action '*'"),
    ({"Effect": "Allow", "Action": ["s3:GetObject", "s3:*"], "Resource": ["*"]}, "Action 's3:*'"),
    ({"Effect": "Allow", "NotAction": "iam:*", "Resource": "arn:aws:s3:::b/*"}, "NotAction"),
    ({"Effect": "Allow", "Action": "s3:GetObject", "NotResource": "arn:aws:s3:::b/*"}, "NotResource"),
])
def test_least_privilege_check_catches_wide_grants(statement, problem):
    problems = check_least_privilege({"Version": "2012-10-17", "Statement": [statement]})
    assert problems and problem in problems[0]
    # the same wildcard scoped to a resource, or denied, is fine
    assert check_least_privilege({"Statement": [{"Effect": "Deny", "Action": "*", "Resource": "*"}]}) == []
    assert check_least_privilege({"Statement": {"Effect": "Allow", "Action": "s3:*",
                                                "Resource": "arn:aws:s3:::b/p/*"}}) == []


def test_normalized_policy_compares_scalars_and_lists_alike():
    a = {"Statement": [{"Action": ["s3:GetObject"], "Resource": "x"}]}
    b = {"Statement": {"Action": "s3:GetObject", "Resource": ["x"]}}
    assert normalized(a) == normalized(b) and normalized(a) != normalized({"Statement": []})


# -- state ----------------------------------------------------------------------------------------------------------

def test_load_outputs_exact_keys_and_default_name(monkeypatch):
    assert load_outputs() is None
    state = State("lab")
    state.data["outputs"] = {k: f"v-{k}" for k in OUTPUT_KEYS}
    state.save()
    assert load_outputs("lab") == {k: f"v-{k}" for k in OUTPUT_KEYS}
    assert load_outputs() is None  # default name "stoker"
    monkeypatch.setenv("STOKER_INFRA", "lab")
    assert set(load_outputs()) == set(OUTPUT_KEYS)
    state.data["outputs"] = None  # an apply that stopped half-way
    state.save()
    assert load_outputs() is None


def test_state_is_written_on_every_record_and_forget():
    s = State("x")
    s.record("bucket", kind="S3 bucket", name="b", id="b", arn=None, created_by_stoker=True)
    assert State.load("x").created("bucket")
    s.forget("bucket")
    assert State.load("x").resources == {}


def test_a_pushed_digest_becomes_the_infras_image():
    from stoker.backends.aws.infra.state import pushed_image, record_image

    repo = "123456789012.dkr.ecr.us-east-1.amazonaws.com/stoker"
    ref = f"{repo}@sha256:" + "ab" * 32
    assert record_image(ref, repo) is None  # no infra yet
    state = State("stoker")
    state.data["outputs"] = {**{k: None for k in OUTPUT_KEYS}, "ecr_repository_uri": repo}
    state.save()
    assert record_image(f"{repo}:latest", repo) is None  # a tag is never recorded: it moves
    assert record_image("ghcr.io/me/stoker@sha256:" + "ab" * 32, "ghcr.io/me/stoker") is None  # not its repo
    assert load_outputs()["image"] is None
    assert record_image(ref, repo) == "stoker"
    assert load_outputs()["image"] == ref
    # kept in the state, outside the outputs, so the next apply (which rewrites them) keeps naming it
    assert pushed_image(State.load("stoker"), repo) == ref and pushed_image(State.load("stoker"), "other") is None


def test_wait_times_out_with_what_and_the_fix():
    now = [0.0]
    ctx = Context(cfg=cfg(), clients=Clients("us-east-1", factory=lambda s: None), state=State("x"),
                  facts=facts(), clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s),
                  timeout=30, poll=10)
    with pytest.raises(BackendError, match="timed out after 30s waiting for the queue.*Fix: look at it"):
        ctx.wait("the queue", lambda: False, "look at it")
    seen = []
    ctx.wait("x", lambda: seen.append(1) or len(seen) > 2, "fix")
    assert len(seen) == 3


def test_retry_waits_out_transient_aws_errors_then_gives_up_with_the_fix():
    from botocore.exceptions import ClientError

    now = [0.0]
    answers = []

    class Ec2:
        def delete_security_group(self, **_):
            answers.append(1)
            if len(answers) < 3:
                raise ClientError({"Error": {"Code": "DependencyViolation", "Message": "in use"}},
                                  "DeleteSecurityGroup")
            return {}

    ctx = Context(cfg=cfg(), clients=Clients("us-east-1", factory=lambda s: Ec2()), state=State("x"),
                  facts=facts(), clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s),
                  timeout=60, poll=10, report=lambda line: None)

    def delete():
        return ctx.call("ec2", "delete_security_group", "security group sg-1", GroupId="sg-1")

    assert ctx.retry("interfaces go", delete, ("DependencyViolation",), "delete them") == {}
    assert len(answers) == 3
    answers.clear()
    ctx.timeout = 5
    with pytest.raises(BackendError, match="ec2:DeleteSecurityGroup on security group sg-1 failed: "
                                           "DependencyViolation.*still failing after 5s.*delete them"):
        ctx.retry("interfaces go", delete, ("DependencyViolation",), "delete them")
    with pytest.raises(BackendError, match="DependencyViolation"):  # another code: no retry at all
        answers.clear()
        ctx.retry("x", delete, ("Throttling",), "fix")
    assert len(answers) == 1
