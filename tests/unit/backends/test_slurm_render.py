"""sbatch scripts as golden files (regenerate with STOKER_UPDATE_GOLDEN=1), and @slurm's validation."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from stoker.backends.slurm.decorator import SlurmDecorator, mem_to_mb, slurm, time_to_minutes
from stoker.backends.slurm.render import SlurmOptions, effective_options, log_folder, render_sbatch
from stoker.errors import ConfigError
from stoker.flow.decorators import DECORATORS, parse_with
from stoker.runtime.contract import Unit
from stoker.runtime.spec import TaskSpec

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "slurm"
OPTS = SlurmOptions(python="/opt/venv/bin/python", log_dir="/shared/stoker/slurm")


def make_unit(kind: str, n: int, **kw) -> Unit:
    specs = [TaskSpec(flow="Pretrain", run_id="42", step="train", task_id=str(7 + i), attempt=kw.pop("attempt", 0))
             for i in range(n)] if n else []
    return Unit(kind=kind, flow="Pretrain", run_id="42", step="train", specs=specs, store_url="s3://bucket/stoker",
                code_key="sha256-code", spec_key="sha256-spec", flow_path="pretrain.py", **kw)


CASES = {
    "task": lambda: make_unit("task", 1),
    "gang": lambda: make_unit("gang", 2, attempt=1, options=SlurmDecorator(
        {"partition": "gpu", "gpus_per_node": 8, "cpus_per_task": 16, "mem": "200G", "time": "02:00:00",
         "account": "llm", "qos": "high", "constraint": "h100", "exclusive": True,
         "extra": ["--reservation=big"]}).attributes),
    "array": lambda: make_unit("array", 5, resources={"cpu": 2, "memory": 4000}),
    "gang_spares": lambda: make_unit("gang", 2, attempt=1, spares=1, first_slots=[1, 2],
                                     resources={"cpu": 2, "memory": 4000}),
    "timeout": lambda: make_unit("task", 1, timeout_s=3601),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_scripts(name):
    opts = OPTS if name != "array" else SlurmOptions(python=OPTS.python, log_dir=OPTS.log_dir, array_throttle=2)
    text = render_sbatch(CASES[name](), opts)
    path = GOLDEN / f"{name}.sbatch"
    if os.environ.get("STOKER_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: run with STOKER_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name}: the script changed; if on purpose, rerun with STOKER_UPDATE_GOLDEN=1"
    assert text == render_sbatch(CASES[name](), opts)  # deterministic


def test_script_shape():
    gang = render_sbatch(CASES["gang"](), OPTS)
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1" in gang
    assert re.search(r"^exec srun --kill-on-bad-exit=1 --nodes=2 --ntasks=2 ", gang, re.M)
    assert "--output=/shared/stoker/slurm/Pretrain/42/train-7-1/%j-%n.out" in gang
    for flag in ("--no-requeue", "--open-mode=append", "--export=ALL", "--job-name=stoker.Pretrain.train",
                 "--time=02:00:00", "--exclusive", "--reservation=big", "--gpus-per-node=8", "--mem=200G"):
        assert f"#SBATCH {flag}" in gang
    assert "STOKER_MAIN_ADDR" in gang and "scontrol show hostnames" in gang
    array = render_sbatch(CASES["array"](), OPTS)
    assert "#SBATCH --array=0-4\n" in array and "%A-%a.out" in array and "--kill-on-bad-exit" not in array
    assert "#SBATCH --cpus-per-task=2" in array and "#SBATCH --mem=4000" in array  # from @resources
    assert "#SBATCH --time=66" in render_sbatch(CASES["timeout"](), OPTS)  # 61 minutes + the margin
    assert "--time" not in render_sbatch(CASES["task"](), OPTS)


def test_gang_with_spares_keeps_its_allocation_through_a_node_loss():
    text = render_sbatch(CASES["gang_spares"](), OPTS)
    assert "(a gang of 2 nodes and 1 spare)" in text
    assert "#SBATCH --nodes=3\n#SBATCH --ntasks-per-node=1\n#SBATCH --no-kill\n" in text
    assert re.search(r"^exec srun --no-kill --nodes=3 --ntasks=3 --ntasks-per-node=1 ", text, re.M)
    assert "--kill-on-bad-exit" not in text and "--no-requeue" in text
    assert 'export STOKER_NODE_ADDRS="$addrs"' in text and "unset STOKER_NODE_ADDR\n" in text
    plain = render_sbatch(CASES["gang"](), OPTS)
    assert "--no-kill" not in plain and "STOKER_NODE_ADDRS" not in plain


def test_node_addrs_script_line_parses_scontrol_output(tmp_path):
    """The batch script's sed over `scontrol -o show node` gives name=NodeAddr per node (run with a fake scontrol)."""
    import subprocess

    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\n"
                    "echo 'NodeName=n1 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.0.0.1 NodeHostName=h1 Version=22.05'\n"
                    "echo 'NodeName=gpu-07 Arch=x86_64 NodeAddr=gpu-07.ib NodeHostName=gpu-07 Port=6818'\n")
    fake.chmod(0o755)
    line = next(x for x in render_sbatch(CASES["gang_spares"](), OPTS).splitlines() if x.startswith("addrs="))
    out = subprocess.run(["bash", "-c", line + '; echo "$addrs"'], capture_output=True, text=True, check=True,
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "n1,gpu-07"}).stdout
    assert out.strip() == "n1=10.0.0.1,gpu-07=gpu-07.ib"


def test_no_environment_values_or_secrets_in_the_script(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-v4lue-do-not-leak")
    monkeypatch.setenv("HF_TOKEN", "hf_leaky_token_123")
    unit = make_unit("gang", 2, env={"WANDB_API_KEY": "wandb-secret-456"})
    text = render_sbatch(unit, SlurmOptions(python="/opt/venv/bin/python", log_dir="/shared/stoker/slurm"))
    for secret in ("s3cr3t-v4lue-do-not-leak", "hf_leaky_token_123", "wandb-secret-456", "WANDB_API_KEY"):
        assert secret not in text


def test_member_command_is_quoted():
    unit = make_unit("task", 1)
    unit.store_url = "/shared/my store"
    assert "--store '/shared/my store'" in render_sbatch(unit, OPTS)


def test_log_folder_is_unique_per_attempt():
    assert log_folder(make_unit("task", 1), OPTS) != log_folder(make_unit("task", 1, attempt=1), OPTS)


def test_default_log_dir_is_under_stoker_home(monkeypatch, tmp_path):
    monkeypatch.setenv("STOKER_HOME", str(tmp_path))
    assert SlurmOptions().log_dir == str(tmp_path / "slurm")
    with pytest.raises(ConfigError, match="array_throttle"):
        SlurmOptions(array_throttle=0)


# -- @slurm ---------------------------------------------------------------------------------------------
def test_decorator_is_registered_and_usable_from_the_cli():
    assert DECORATORS["slurm"] is SlurmDecorator
    d = parse_with("slurm:partition=gpu,mem=16G,time=90,nodes=2")
    assert d.attributes["partition"] == "gpu" and d.attributes["mem"] == "16G" and d.attributes["nodes"] == 2

    @slurm(partition="debug")
    def f():
        pass

    assert f._pending_decorators[0].attributes["partition"] == "debug"


@pytest.mark.parametrize("attrs, match", [
    ({"mem": "4 GB"}, r"mem='16G'"), ({"mem": 0}, "more than 0"), ({"mem": "lots"}, "megabytes"),
    ({"time": "2h"}, "HH:MM:SS"), ({"time": 0}, "more than 0"), ({"time": "1:2:3:4"}, "D-HH:MM:SS"),
    ({"nodes": 0}, "at least 1"), ({"nodes": "two"}, "whole number"), ({"cpus_per_task": 1.5}, "whole number"),
    ({"gpus_per_node": "many"}, "type:count"), ({"gpus_per_node": True}, "type:count"),
    ({"partition": ""}, "non-empty"), ({"exclusive": "yes"}, "True or False"), ({"extra": ["oops"]}, "sbatch options"),
    ({"memory": "4G"}, "no argument memory"),
])
def test_decorator_rejects_bad_values_with_the_fix(attrs, match):
    with pytest.raises(ConfigError, match=match):
        SlurmDecorator(attrs)


def test_decorator_normalizes_good_values():
    a = SlurmDecorator({"mem": 4000, "time": "1-00:00:00", "gpus_per_node": "a100:4", "extra": "--mail-type=END",
                        "nodes": "3"}).attributes
    assert (a["mem"], a["time"], a["gpus_per_node"], a["extra"], a["nodes"]) == \
        ("4000", "1-00:00:00", "a100:4", ["--mail-type=END"], 3)
    assert SlurmDecorator({"mem": "512mb"}).attributes["mem"] == "512M"
    assert SlurmDecorator({"time": "unlimited"}).attributes["time"] == "UNLIMITED"
    assert mem_to_mb("4G") == 4096 and mem_to_mb("4000") == 4000 and mem_to_mb("1T") == 1024 * 1024
    assert [time_to_minutes(t) for t in (90, "90", "30:00", "02:00:00", "1-00", "1-02:30", "1-00:00:30")] == \
        [90, 90, 30, 120, 1440, 1590, 1440.5]


def test_effective_options_prefer_slurm_over_resources():
    unit = make_unit("task", 1, options={"cpus_per_task": 4, "exclusive": False}, resources={"cpu": 2, "gpu": 1},
                     timeout_s=30)
    assert effective_options(unit) == {"cpus_per_task": 4, "gpus_per_node": 1, "time": 6}
