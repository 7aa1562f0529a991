"""Batch job definitions and SubmitJob requests as golden files (regenerate with STOKER_UPDATE_GOLDEN=1),
checked against botocore's service model (moto does not model multi-node jobs or node overrides), and @batch's
validation."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from stoker.backends.aws.decorator import BatchDecorator, node_resources
from stoker.backends.aws.render import BatchOptions, render_requests
from stoker.errors import ConfigError
from stoker.flow.decorators import parse_with
from stoker.runtime.contract import Unit
from stoker.runtime.spec import TaskSpec

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "aws_batch"
OPTS = BatchOptions(queue="stoker-queue", image="123456789012.dkr.ecr.us-east-1.amazonaws.com/stoker:latest",
                    job_role="arn:aws:iam::123456789012:role/stoker-job", region="us-east-1", use_infra=False,
                    store_key_secret="arn:aws:secretsmanager:us-east-1:123456789012:secret:stoker/bucket/stoker/"
                                     "store-key-AbCdEf")


def make_unit(kind: str, n: int, attempt: int = 0, **kw) -> Unit:
    specs = [TaskSpec(flow="Pretrain", run_id="42", step="train", task_id=str(7 + i), attempt=attempt)
             for i in range(n)]
    return Unit(kind=kind, flow="Pretrain", run_id="42", step="train", specs=specs, store_url="s3://bucket/stoker",
                code_key="sha256-code", spec_key="sha256-spec", flow_path="pretrain.py",
                env={"STOKER_RUN_ID": "42"}, **kw)


def batch(**attrs) -> dict:
    return BatchDecorator(attrs).attributes


CASES = {
    "task": lambda: make_unit("task", 1, options=batch(cpu=4, memory=16000)),
    # the seed recipe: 4 trn1.32xlarge nodes, 16 Trainium devices and 8 EFA interfaces each
    "trainium_gang": lambda: make_unit("gang", 4, attempt=1, timeout_s=36000, options=batch(
        trainium=16, efa=8, cpu=96, memory=480000, shared_memory=65536, instance_type="trn1.32xlarge",
        aws_batch_tags={"team": "llm"})),
    # a gang of 2 with 1 hot spare: one job of 3 nodes, the main node kept as the spare (backends/aws/node.py)
    "gang_spares": lambda: make_unit("gang", 2, spares=1, first_slots=[1, 2], timeout_s=3600, options=batch(
        cpu=8, memory=28000, instance_type="c5.4xlarge")),
    "gpu_task": lambda: make_unit("task", 1, resources={"gpu": 8, "cpu": 32, "memory": 200000}, options=batch(
        use_tmpfs=True, tmpfs_size=8192, host_volumes=["/fsx"], max_swap=0, swappiness=10, privileged=True,
        iam_role="arn:aws:iam::123456789012:role/other", queue="gpu-queue")),
}


def _service(name: str):
    import botocore.session

    return botocore.session.get_session().get_service_model(name)


def validate(operation: str, params: dict) -> None:
    """botocore's own validation of a request against the Batch service model (raises on any error)."""
    from botocore.validate import ParamValidator

    shape = _service("batch").operation_model(operation).input_shape
    report = ParamValidator().validate(params, shape)
    assert not report.has_errors(), report.generate_report()


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_requests(name):
    jd, sub, text = render_requests(CASES[name](), OPTS)
    path = GOLDEN / f"{name}.json"
    if os.environ.get("STOKER_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: run with STOKER_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name}: the requests changed; if on purpose, rerun with STOKER_UPDATE_GOLDEN=1"
    assert render_requests(CASES[name](), OPTS)[2] == text  # deterministic
    validate("RegisterJobDefinition", jd)
    validate("SubmitJob", sub)


def test_multinode_job_shape():
    jd, sub, _ = render_requests(CASES["trainium_gang"](), OPTS)
    assert jd["type"] == "multinode"
    props = jd["nodeProperties"]
    assert props["mainNode"] == 0 and props["numNodes"] == 4
    assert [r["targetNodes"] for r in props["nodeRangeProperties"]] == ["0:"]
    assert sub["nodeOverrides"]["numNodes"] == 4
    c = props["nodeRangeProperties"][0]["container"]
    devices = [d["hostPath"] for d in c["linuxParameters"]["devices"]]
    assert devices == [f"/dev/neuron{i}" for i in range(16)] + [f"/dev/infiniband/uverbs{i}" for i in range(8)]
    assert {"name": "memlock", "softLimit": -1, "hardLimit": -1} in c["ulimits"]
    assert c["linuxParameters"]["sharedMemorySize"] == 65536
    assert {"type": "MEMORY", "value": "480000"} in c["resourceRequirements"]
    assert sub["timeout"] == {"attemptDurationSeconds": 36000 + 300}
    assert sub["tags"]["team"] == "llm" and sub["tags"]["stoker:attempt"] == "1"


def test_a_gang_with_spares_is_one_job_of_all_its_nodes():
    """N + k nodes in one multi-node job; without spares the requests are what they were (the golden files)."""
    jd, sub, text = render_requests(CASES["gang_spares"](), OPTS)
    assert jd["nodeProperties"]["numNodes"] == 3 and sub["nodeOverrides"]["numNodes"] == 3
    assert jd["nodeProperties"]["mainNode"] == 0
    assert [r["targetNodes"] for r in jd["nodeProperties"]["nodeRangeProperties"]] == ["0:"]
    plain = make_unit("gang", 2, timeout_s=3600, options=batch(cpu=8, memory=28000, instance_type="c5.4xlarge"))
    jd0, sub0, _ = render_requests(plain, OPTS)
    assert jd0["nodeProperties"]["numNodes"] == 2 and sub0["nodeOverrides"]["numNodes"] == 2
    strip = lambda d: json.loads(json.dumps(d).replace('"numNodes": 3', '"numNodes": 2'))  # noqa: E731
    assert strip({k: v for k, v in sub.items() if k != "jobDefinition"}) == \
        {k: v for k, v in sub0.items() if k != "jobDefinition"}, "only the node count differs in the submission"
    assert strip({k: v for k, v in jd.items() if k != "jobDefinitionName"}) == \
        {k: v for k, v in jd0.items() if k != "jobDefinitionName"}


def test_no_secret_and_no_per_run_value_in_the_definition(monkeypatch):
    """The definition is the step's (reused by every run); keys and environment travel in the submission."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "SECRET-VALUE")
    monkeypatch.setenv("STOKER_STORE_KEY", "STORE-KEY-VALUE")  # the store's signing key: never in a request
    jd1, sub1, text = render_requests(make_unit("task", 1, options=batch(cpu=2)), OPTS)
    other = make_unit("task", 1, options=batch(cpu=2))
    other.run_id, other.spec_key, other.env = "43", "sha256-other", {"STOKER_RUN_ID": "43"}
    jd2, sub2, _ = render_requests(other, OPTS)
    assert jd1 == jd2 and sub1 != sub2
    assert "SECRET-VALUE" not in text and "STORE-KEY-VALUE" not in text
    env = {e["name"]: e["value"] for e in sub1["containerOverrides"]["environment"]}
    assert env["STOKER_STORE_KEY_SECRET"] == OPTS.store_key_secret and "STOKER_STORE_KEY" not in env
    gang = make_unit("gang", 2, options=batch(cpu=2))
    gang.env = {**gang.env, "STOKER_STORE_KEY": "STORE-KEY-VALUE"}  # even if something put it in the unit's env
    _, _, gang_text = render_requests(gang, OPTS)
    assert "STORE-KEY-VALUE" not in gang_text and "STOKER_STORE_KEY_SECRET" in gang_text
    assert jd1["containerProperties"]["command"][-6:] == ["--store", "Ref::store", "--code", "Ref::code",
                                                           "--spec", "Ref::spec"]
    assert sub1["parameters"] == {"store": "s3://bucket/stoker", "code": "sha256-code", "spec": "sha256-spec"}
    jd3, _, _ = render_requests(make_unit("task", 1, options=batch(cpu=4)), OPTS)
    assert jd3["jobDefinitionName"] != jd1["jobDefinitionName"], "another content, another name"


def test_resources_merge_like_metaflow():
    assert node_resources({}, {}) == {"cpu": 1, "memory": 4096, "gpu": 0, "trainium": 0, "inferentia": 0,
                                      "efa": 0, "shared_memory": 0}
    merged = node_resources(batch(cpu=2, memory=1000, trainium=16), {"cpu": 8.0, "memory": 500, "efa": 8})
    assert merged["cpu"] == 8 and merged["memory"] == 1000 and merged["trainium"] == 16 and merged["efa"] == 8


@pytest.mark.parametrize("attrs, words", [
    ({"cpu": -1}, "at least 0"),
    ({"memory": "lots"}, "whole number"),
    ({"trainium": 16, "inferentia": 2}, "one kind of Neuron device"),
    ({"swappiness": 101}, "between 0 and 100"),
    ({"host_volumes": ["relative"]}, "absolute host paths"),
    ({"queue": "has space"}, "without spaces"),
    ({"instance_type": "huge"}, "like 'trn1.32xlarge'"),
    ({"gpus": 1}, "has no argument gpus"),
])
def test_bad_batch_arguments_name_the_fix(attrs, words):
    with pytest.raises(ConfigError, match=words):
        BatchDecorator(attrs)


def test_with_batch_from_the_cli():
    d = parse_with("batch:queue=big,trainium=16,efa=8")
    assert d.name == "batch" and d.attributes["queue"] == "big" and d.attributes["trainium"] == 16


def test_dry_run_text_is_json_of_both_requests():
    _, _, text = render_requests(CASES["task"](), OPTS)
    doc = json.loads(text)
    assert set(doc) == {"RegisterJobDefinition", "SubmitJob"}
    assert doc["SubmitJob"]["jobDefinition"] == doc["RegisterJobDefinition"]["jobDefinitionName"]


def test_an_accelerator_step_gets_the_whole_node_unless_told():
    """Batch's defaults (1 vCPU, 4096 MiB) would starve a node of 16 Trainium devices."""
    jd, _, _ = render_requests(make_unit("gang", 2, options=batch(trainium=16, efa=8)), OPTS)
    reqs = jd["nodeProperties"]["nodeRangeProperties"][0]["container"]["resourceRequirements"]
    # fits every type that has 16 Trainium devices and 8 EFA interfaces (trn1n.32xlarge: the least ECS memory)
    assert {"type": "MEMORY", "value": "507510"} in reqs and {"type": "VCPU", "value": "128"} in reqs
    told, _, _ = render_requests(make_unit("task", 1, options=batch(gpu=1, memory=8000)), OPTS)
    reqs = told["containerProperties"]["resourceRequirements"]
    assert {"type": "MEMORY", "value": "8000"} in reqs and {"type": "VCPU", "value": "4"} in reqs  # g5.xlarge
    plain, _, _ = render_requests(make_unit("task", 1), OPTS)
    assert {"type": "MEMORY", "value": "4096"} in plain["containerProperties"]["resourceRequirements"]


def test_nodes_get_the_region_an_init_process_and_a_long_rendezvous(monkeypatch):
    monkeypatch.delenv("STOKER_RDZV_TIMEOUT", raising=False)
    jd, sub, _ = render_requests(make_unit("gang", 2), OPTS)
    env = {e["name"]: e["value"] for e in sub["nodeOverrides"]["nodePropertyOverrides"][0]["containerOverrides"][
        "environment"]}
    assert env["AWS_REGION"] == "us-east-1" and env["STOKER_RDZV_TIMEOUT"] == "3600"
    assert jd["nodeProperties"]["nodeRangeProperties"][0]["container"]["linuxParameters"]["initProcessEnabled"]
