"""The store's signing key in AWS Secrets Manager, against moto's server on loopback: `stoker infra apply` makes
the secret (holding the key this machine already signs with) and lets only the job role read it, `destroy` keeps
it with the bucket; a Batch node with nothing but the secret's ARN reads and signs the store's documents; a
teammate without a key gets it from the secret. Every request goes through boto3's validation against the
service model (the Loopback of test_aws_infra records them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from test_aws_infra import SECRET, Loopback, config  # pytest puts this folder on sys.path

from stoker.backends.aws.infra import apply, check_least_privilege, destroy
from stoker.errors import StoreError
from stoker.store.blobs import open_store
from stoker.store.manifest import read_run_record, write_run_record
from stoker.store.signing import key_path, secret_pointer, store_key

pytestmark = pytest.mark.aws
SRC = str(Path(__file__).resolve().parents[2] / "src")
URL = "s3://stoker-test-bucket/stoker"
CPU = {"instance_types": ["c5.4xlarge"], "max_vcpus": 64, "placement_group": False}  # no stand-ins needed


@pytest.fixture()
def full(aws, tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_KEY_DIR", str(tmp_path / "keys"))
    monkeypatch.setenv("MOTO_IAM_LOAD_MANAGED_POLICIES", "true")
    urllib.request.urlopen(urllib.request.Request(f"{aws.endpoint}/moto-api/reset", method="POST"))
    return Loopback(aws)


def _node(tmp_path: Path, code: str, **env: str) -> subprocess.CompletedProcess:
    """A Batch node: no $STOKER_STORE_KEY, no key file (an empty key folder), the job's environment `env`."""
    base = {k: v for k, v in os.environ.items() if k not in ("STOKER_STORE_KEY", "STOKER_STORE_KEY_SECRET")}
    (tmp_path / "node-keys").mkdir(exist_ok=True)
    base.update(STOKER_KEY_DIR=str(tmp_path / "node-keys"), PYTHONPATH=SRC, **env)
    return subprocess.run([sys.executable, "-c", "from stoker.store.manifest import read_run_record, write_run_record\n"
                           f"from stoker.store.blobs import open_store\nstore = open_store({URL!r})\n{code}"],
                          env=base, capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # three applies and three destroys (~30 s)
def test_apply_makes_the_secret_only_the_job_role_reads_and_destroy_keeps_it_with_the_bucket(full):
    loop, cfg = full, config(full, **CPU)
    lines: list[str] = []
    arn = apply(cfg, loop.clients(), report=lines.append).outputs["store_key_secret_arn"]
    assert arn.startswith(f"arn:aws:secretsmanager:us-east-1:123456789012:secret:{SECRET}")
    sm = loop.aws.client("secretsmanager")
    # the key this machine already signs with ($STOKER_STORE_KEY here), so its runs stay readable
    assert sm.get_secret_value(SecretId=arn)["SecretString"] == os.environ["STOKER_STORE_KEY"]
    assert any("holds $STOKER_STORE_KEY" in line for line in lines), lines
    (req,) = loop.requests("CreateSecret")
    assert {"Key": "stoker:infra", "Value": "stoker"} in req["Tags"]
    job = loop.aws.client("iam").get_role_policy(RoleName="stoker-job-role", PolicyName="stoker-store")[
        "PolicyDocument"]
    (grant,) = [s for s in job["Statement"] if "secretsmanager" in json.dumps(s)]
    assert (grant["Action"], grant["Resource"]) == ("secretsmanager:GetSecretValue", arn)  # this secret only
    assert check_least_privilege(job) == []
    assert secret_pointer(URL) == arn  # this machine's pointer to it

    loop.calls.clear()
    apply(cfg, loop.clients())
    assert loop.mutations() == []

    destroy(cfg, clients=loop.clients())
    assert "DeletedDate" not in sm.describe_secret(SecretId=arn), "kept with the bucket: it signs the store's runs"
    destroy(cfg, clients=loop.clients(), delete_bucket=True)
    assert "DeletedDate" in sm.describe_secret(SecretId=arn) and secret_pointer(URL) is None
    assert loop.leftovers() == []
    (req,) = loop.requests("DeleteSecret")
    assert req["RecoveryWindowInDays"] == 7 and "ForceDeleteWithoutRecovery" not in req

    # applied again within the recovery window: the same secret (and key) comes back
    again = apply(cfg, loop.clients())
    assert again.outputs["store_key_secret_arn"] == arn and len(loop.requests("RestoreSecret")) == 1
    assert sm.get_secret_value(SecretId=arn)["SecretString"] == os.environ["STOKER_STORE_KEY"]
    destroy(cfg, clients=loop.clients(), delete_bucket=True, force=True)
    with pytest.raises(sm.exceptions.ResourceNotFoundException):
        sm.describe_secret(SecretId=arn)


def test_a_node_with_only_the_secret_reads_and_signs(full, tmp_path):
    loop = full
    arn = apply(config(loop, **CPU), loop.clients()).outputs["store_key_secret_arn"]
    store = open_store(URL)
    write_run_record(store, {"flow": "F", "run_id": "1", "user": "alice", "params": {}})  # on the laptop

    p = _node(tmp_path, "print(read_run_record(store, 'F', '1')['user'])\n"
              "write_run_record(store, {'flow': 'F', 'run_id': '2', 'user': 'node', 'params': {}})",
              STOKER_STORE_KEY_SECRET=arn)
    assert p.returncode == 0 and p.stdout.strip() == "alice", p.stderr
    assert read_run_record(store, "F", "2")["user"] == "node"  # what the node signed, the laptop verifies

    p = _node(tmp_path, "read_run_record(store, 'F', '1')")
    assert p.returncode != 0 and f"no signing key for the store {URL}" in p.stderr
    p = _node(tmp_path, "read_run_record(store, 'F', '1')", STOKER_STORE_KEY_SECRET="stoker/nope")
    assert "cannot read the store's signing key from the AWS Secrets Manager secret stoker/nope" in p.stderr
    assert "ResourceNotFoundException" in p.stderr and "secretsmanager:GetSecretValue" in p.stderr
    other = loop.aws.client("secretsmanager").create_secret(Name="other", SecretString="another key")["ARN"]
    p = _node(tmp_path, "read_run_record(store, 'F', '1')", STOKER_STORE_KEY_SECRET=other)
    assert "bad signature" in p.stderr


def test_a_teammate_gets_the_key_from_the_secret(full, tmp_path, monkeypatch):
    loop, cfg = full, config(full, **CPU)
    apply(cfg, loop.clients())
    write_run_record(open_store(URL), {"flow": "F", "run_id": "1", "user": "alice", "params": {}})

    monkeypatch.delenv("STOKER_STORE_KEY")  # another machine: no key of its own
    monkeypatch.setenv("STOKER_KEY_DIR", str(tmp_path / "bob"))
    with pytest.raises(StoreError, match="no signing key .*STOKER_STORE_KEY_SECRET.*stoker infra apply"):
        store_key(URL)
    loop.calls.clear()
    lines: list[str] = []
    apply(cfg, loop.clients(), report=lines.append)  # the team's TOML: changes nothing, points bob at the secret
    assert loop.mutations() == [] and any("with the key in arn:aws:secretsmanager" in ln for ln in lines), lines
    assert read_run_record(open_store(URL), "F", "1")["user"] == "alice"

    key_path(URL).write_text("bob's own key\n")  # a key of his own, which nobody else has: apply says so
    lines.clear()
    apply(cfg, loop.clients(), report=lines.append)
    assert any(ln.startswith("warning: ") and "differs from the key in" in ln for ln in lines), lines
