"""Issue 34 item 10: docs/aws.md "From zero to a 4-node Trainium job" and the example it runs
(examples/aws/llama2_trainium.py): the dataset is made before the first run, `$STOKER_STORE` is exported before it
is used, and the example's `start` refuses a dataset prefix that holds nothing before the gang is launched."""

from __future__ import annotations

import importlib.util
import re

import pytest

from stoker.errors import ConfigError
from tests.helpers import EXAMPLES, ROOT

FLOW = EXAMPLES / "aws" / "llama2_trainium.py"


def _zero_to_job_block() -> list[str]:
    text = (ROOT / "docs" / "aws.md").read_text()
    section = text.split("## From zero to a 4-node Trainium job", 1)[1]
    return section.split("```bash", 1)[1].split("```", 1)[0].splitlines()


def _first(lines: list[str], pattern: str) -> int:
    return next(i for i, line in enumerate(lines) if re.search(pattern, line))


@pytest.mark.parametrize("where", ["docs/aws.md", "the example's docstring"])
def test_the_walkthrough_prepares_the_data_and_exports_the_store_first(where):
    if where == "docs/aws.md":
        lines = _zero_to_job_block()
    else:
        lines = FLOW.read_text().split('"""', 2)[1].splitlines()
    prepare = _first(lines, r"stoker data prepare .*--format hf|stoker data prepare hf:")
    first_run = _first(lines, r"llama2_trainium\.py run")
    assert prepare < first_run, "the dataset must be made before the first run"
    export = _first(lines, r"export STOKER_STORE=")
    assert export < _first(lines, r"\$STOKER_STORE\b(?!=)"), "STOKER_STORE is used before it is exported"
    assert "wikicorpus-llama2-4096" in "\n".join(lines[prepare:prepare + 2])  # the flow's default --data


def _check_dataset():
    spec = importlib.util.spec_from_file_location("llama2_trainium_example", FLOW)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.check_dataset


def test_start_refuses_a_missing_local_dataset(tmp_path):
    check = _check_dataset()
    missing = str(tmp_path / "wikicorpus-llama2-4096")
    with pytest.raises(ConfigError) as e:
        check(missing)
    msg = str(e.value)
    assert "\n" not in msg and missing in msg and "stoker data prepare" in msg and f"--output {missing}" in msg
    (tmp_path / "wikicorpus-llama2-4096").mkdir()
    check(missing)


@pytest.mark.aws
def test_start_refuses_an_empty_store_prefix(aws):
    s3 = aws.client("s3")
    s3.create_bucket(Bucket="stoker-bucket")
    check = _check_dataset()
    url = "s3://stoker-bucket/stoker/datasets/wikicorpus-llama2-4096"
    with pytest.raises(ConfigError, match=re.escape(f"--format hf --output {url}`")):
        check(url)
    s3.put_object(Bucket="stoker-bucket", Key="stoker/datasets/wikicorpus-llama2-4096/manifest.json", Body=b"{}")
    check(url)
