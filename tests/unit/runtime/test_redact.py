"""Redaction of what goes into error manifests and what is printed (issue 13, Security: secrets at rest)."""

from __future__ import annotations

import json
import sys

import pytest

from stoker.errors import StokerError
from stoker.redact import is_secret_name, redact_command, redact_with_spec

SECRET = "s3cr3t-7d1e9a-VALUE"


def test_credential_flags_and_settings_are_redacted_in_command_lines():
    cmd = ["python", "-m", "torch.distributed.run", "--nnodes=1", "-m", "stoker.train", "--tokenizer", "llama",
           "--hf-token", SECRET, "--api_key=" + SECRET, "--set", "train.password=" + SECRET, "--max_tokens", "5"]
    line = redact_command(cmd)
    assert SECRET not in line
    assert "--tokenizer llama" in line and "--max_tokens 5" in line  # not credentials
    assert "--hf-token ***" in line and "--api_key=***" in line and "train.password=***" in line


def test_secret_parameter_values_are_redacted_anywhere(monkeypatch):
    monkeypatch.setenv("STOKER_SECRET_TOKEN", json.dumps(SECRET))
    assert SECRET not in redact_command(["train.py", "--data", f"s3://bucket/{SECRET}/x"])


@pytest.mark.parametrize("name,secret", [("--token", True), ("aws_secret_access_key", True), ("--api-key", True),
                                          ("train.hf_token", True), ("--tokenizer", False), ("--max-tokens", False),
                                          ("--key-column", False)])
def test_secret_names(name, secret):
    assert is_secret_name(name) is secret


def test_environment_values_in_with_specs_are_hidden():
    spec = "environment:vars=" + json.dumps({"A": SECRET, "B": "x"})
    assert redact_with_spec(spec) == 'environment:vars={"A":"***","B":"***"}'
    assert redact_with_spec("retry:times=2") == "retry:times=2"


def test_a_failed_torchrun_names_its_command_without_secrets(tmp_path, capfd):
    """The torchrun error message goes into the task's manifest (exception) and names the command briefly; the
    whole command, redacted, is at the top of the node's log."""
    from stoker.distributed.torchrun import TorchrunHelper
    from stoker.flow.current import current

    current._set(tempdir=str(tmp_path))
    helper = TorchrunHelper(nnodes=1, node_rank=0, master_addr="127.0.0.1", master_port=29500)
    with pytest.raises(StokerError) as err:
        helper._spawn([sys.executable, "-c", "import sys; sys.exit(3)", "--hf-token", SECRET], {}, "torchrun")
    out = capfd.readouterr().out
    assert SECRET not in str(err.value) and len(str(err.value)) < 300, err.value
    assert "--hf-token ***" in out and SECRET not in out
