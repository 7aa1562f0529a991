"""The main job end to end (examples/llama_pretrain.py): a real 2-node x 2-process torchrun gang (TP=2 x DP=2,
ZeRO-1, gloo), and the two crash tests: a rank killed with SIGKILL mid-training, and the whole `run` process
killed mid-training. Both must finish with weights bitwise equal to an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers import EXAMPLES, run_flow

pytestmark = [pytest.mark.slow, pytest.mark.torch]

FLOW = EXAMPLES / "llama_pretrain.py"
SMALL = ["--set", "train.steps=8", "--set", "checkpoint.every=2", "--set", "checkpoint.keep=10",
         "--set", "evaluate.batches=2", "--set", "evaluate.max_new_tokens=4"]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """One STOKER_HOME for the module, so the prepared dataset is reused (cached by fingerprint)."""
    return tmp_path_factory.mktemp("pipeline_home")


def client(home: Path):
    os.environ["STOKER_HOME"] = str(home)
    from stoker import Flow

    return Flow("LlamaPretrain")


def final_weights(checkpoint: str):
    from stoker.train.hf import load_checkpoint_weights

    return load_checkpoint_weights(checkpoint)[1]


def assert_bitwise_equal(a: dict, b: dict) -> None:
    import torch

    assert sorted(a) == sorted(b)
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs"


@pytest.fixture(scope="module")
def reference(home):
    """An uninterrupted run of the small config: the weights every crash test must reproduce."""
    p = run_flow(FLOW, "run", *SMALL, cwd=home, env={"STOKER_HOME": str(home)}, timeout=900)
    run = client(home).latest_run
    return {"run": run.id, "stdout": p.stdout, "checkpoint": run["join"].task.data.checkpoint,
            "result": run["join"].task.data.result}


def test_pipeline_trains_evaluates_exports_and_summarizes(reference, home):
    run = client(home)[reference["run"]]
    assert run.successful
    join = run["join"].task.data
    m = join.metrics
    assert m["step"] == 8 and m["world_size"] == 4 and m["tp"] == 2 and m["dp"] == 2
    assert m["tokens"] == 8 * 8 * 128 and m["final_loss"] < join.result["losses"][0]
    assert join.data.block_size == 129 and join.data.vocab_size == 32000
    ev = run["evaluate"].task.data.eval
    assert 0 < ev["val_loss"] < 11 and ev["val_perplexity"] > 1 and len(ev["samples"]) == 2
    export = Path(run["export"].task.data.export_dir)
    assert (export / "config.json").is_file() and list(export.glob("*.safetensors"))
    assert "8 steps, 8,192 tokens on 4 ranks (TP=2 x DP=2)" in reference["stdout"]
    assert "validation loss" in reference["stdout"] and str(export) in reference["stdout"]
    cfg = run.config["config"]
    assert cfg["train"]["steps"] == 8 and cfg["parallel"]["tp"] == 2, "the resolved config is stored with the run"
    # nothing the user needs points into the task's scratch folder, deleted when the task ends
    assert "metrics_path" not in join.result
    assert join.train_config["train"]["steps"] == 8 and join.train_config["model_shape"]["n_layers"] >= 1
    assert max(r["step"] for r in run.metrics) == 8, "the training metrics are in the store"
    # rank 0 is on node 0; every rank's output is in its node's log, prefixed with its local rank
    assert "[default0]" in run["train"].task.stdout or any("[default0]" in t.stdout for t in run["train"])


def test_console_is_human_results_are_artifacts(reference, home):
    """The console shows a summary, the progress bar and where to look next; no JSON blob of losses (those are
    artifacts: `result["losses"]`, and stoker.train's result.json)."""
    out = reference["stdout"]
    assert '"losses"' not in out and not any(line.split("] ", 1)[-1].split(":", 1)[-1].lstrip().startswith("{")
                                             for line in out.splitlines()), out[-3000:]
    assert "stoker.train: 8 steps, final loss " in out and "tokens/s" in out
    assert "train ━" in out  # the progress bar
    run_id = reference["run"]
    for text in (f"LlamaPretrain {run_id}: 8 steps", "final train loss", "checkpoint: ", f"stoker show "
                 f"LlamaPretrain/{run_id}", "stoker ui", f'Run("LlamaPretrain/{run_id}")'):
        assert text in out, text
    assert len(reference["result"]["losses"]) == 8  # the numbers stay available to scripts


def test_exported_model_loads_in_transformers_with_the_same_logits(reference, home):
    import torch
    from transformers import AutoModelForCausalLM

    from stoker.train.evaluate import load_model

    run = client(home)[reference["run"]]
    export = run["export"].task.data.export_dir
    hf = AutoModelForCausalLM.from_pretrained(export, torch_dtype=torch.float32).eval()
    ours = load_model(reference["checkpoint"])
    x = torch.randint(0, 32000, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        # the export is bf16: compare against our weights rounded the same way
        ours = ours.to(torch.bfloat16).to(torch.float32)
        assert torch.allclose(hf(x).logits, ours(x), atol=1e-3, rtol=1e-3)


def _wait_for_new_checkpoint(home: Path, before: set[str], proc: subprocess.Popen) -> Path:
    """The checkpoint folder of the run `proc` started, once its first checkpoint is committed."""
    deadline = time.time() + 600
    while time.time() < deadline:
        new = [p for p in _ckpt_root(home).iterdir() if p.name not in before]
        if new and (new[0] / "latest").exists():
            return new[0]
        assert proc.poll() is None, f"run ended before a checkpoint was committed:\n{proc.stdout.read()}"
        time.sleep(0.2)
    raise AssertionError("no checkpoint committed in time")


def _start(home: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(FLOW), "run", *SMALL, *extra], cwd=home,
                            env={**os.environ, "STOKER_HOME": str(home), **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _ckpt_root(home: Path) -> Path:
    return Path(home) / "store" / "checkpoints" / "LlamaPretrain"


def test_a_rank_killed_mid_training_is_retried_and_resumes_bitwise(reference, home):
    before = {p.name for p in _ckpt_root(home).iterdir()}
    proc = _start(home)
    _wait_for_new_checkpoint(home, before, proc)  # then SIGKILL one training rank (on node 1)
    victims = [p for p in psutil.Process(proc.pid).children(recursive=True)
               if p.name() == "stoker-rank3"  # forked from the node's warm launcher (a local gang's default)
               or ("stoker.train" in " ".join(p.cmdline()) and "torch.distributed.run" not in " ".join(p.cmdline())
                   and p.environ().get("RANK") == "3")]
    assert victims, "rank 3 must be running"
    killed_at = time.time()
    victims[0].send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-4000:]
    assert "stopping the other 1 node(s)" in out
    run = client(home).latest_run
    train = list(run["train"])
    assert all(t.retry_count == 1 for t in train), "the whole gang was retried"
    result = run["join"].task.data.result
    assert result["resumed_from"], "the retry resumed from the committed checkpoint"
    assert time.time() - killed_at < 900
    assert_bitwise_equal(final_weights(result["checkpoint"]), final_weights(reference["checkpoint"]))


def test_killing_the_run_process_then_resume_finishes_bitwise(reference, home):
    before = {p.name for p in _ckpt_root(home).iterdir()}
    proc = _start(home)
    killed = _wait_for_new_checkpoint(home, before, proc).name
    tree = psutil.Process(proc.pid).children(recursive=True)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    # the workers get SIGTERM (they checkpoint and stop); the reaper kills what is left after the 30 s grace
    gone, alive = psutil.wait_procs(tree, timeout=30 + 15)
    alive = [p for p in alive if _still_running(p)]  # a zombie has ended (its new parent, init, reaps it)
    assert not alive, f"tasks outlived the killed scheduler: {[p.pid for p in alive]}"
    p = run_flow(FLOW, "resume", killed, cwd=home, env={"STOKER_HOME": str(home)}, timeout=900)
    assert "resuming from the checkpoints of run" in p.stdout
    run = client(home).latest_run
    assert run.successful and run.origin_run_id == killed
    assert run["start"].task.origin_pathspec, "data preparation was cloned, not repeated"
    result = run["join"].task.data.result
    assert result["resumed_from"] and killed in result["resumed_from"]
    assert_bitwise_equal(final_weights(result["checkpoint"]), final_weights(reference["checkpoint"]))
    assert json.dumps(run["join"].task.data.metrics)  # the summary artifacts are there


def _still_running(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:  # gone, or a zombie psutil cannot read
        return False


def _slurm_jobs(home: Path, run_id: str, step: str) -> list[dict]:
    folder = Path(home) / "store" / "runs" / "LlamaPretrain" / run_id / "jobs"
    refs = [json.loads(p.read_text()) for p in folder.glob("*.json")]
    return sorted((r for r in refs if r["step"] == step), key=lambda r: r["attempt"])


@pytest.mark.slurm
def test_train_on_slurm_is_bitwise_the_local_run(reference, home, slurm_cluster):
    """`train` as one 2-node Slurm job (2 processes a node), every other step here: the same weights."""
    p = run_flow(FLOW, "run", *SMALL, "--backend", "slurm=train", cwd=home, timeout=900,
                 env={"STOKER_HOME": str(home), "STOKER_SHARED_PATHS": str(home)})
    run = client(home).latest_run
    assert run.successful, p.stdout[-3000:]
    gang = _slurm_jobs(home, run.id, "train")
    assert len(gang) == 1 and gang[0]["backend"] == "slurm" and gang[0]["members"] == 2
    assert not _slurm_jobs(home, run.id, "start"), "start ran here, not on the cluster"
    train = sorted(run["train"], key=lambda t: t.data.node)
    assert "[default0]" in train[0].stdout, "node 0's log (rank 0) came back from the cluster"
    result = run["join"].task.data.result
    assert_bitwise_equal(final_weights(result["checkpoint"]), final_weights(reference["checkpoint"]))


@pytest.mark.aws
def test_train_on_emulated_aws_batch_is_bitwise_the_local_run(reference, aws, tmp_path, monkeypatch):
    """`train` as one 2-node Batch multi-node job (tests/batch_emulator.py: moto's API, nodes as local processes
    with Batch's environment), the store, dataset and checkpoints on S3 (moto): the same weights as locally."""
    from tests.batch_emulator import emulated_batch_env

    env = emulated_batch_env(aws, tmp_path)
    p = run_flow(FLOW, "run", *SMALL, "--backend", "batch=train", cwd=tmp_path, env=env, timeout=900)
    for k in ("STOKER_HOME", "STOKER_STORE"):
        monkeypatch.setenv(k, env[k])
    from stoker import Flow

    run = Flow("LlamaPretrain").latest_run
    assert run.successful, p.stdout[-3000:]
    store = __import__("stoker.store.blobs", fromlist=["open_store"]).open_store(env["STOKER_STORE"])
    jobs = [json.loads(store.read(n)) for n in store.list(f"runs/LlamaPretrain/{run.id}/jobs/") if n.endswith(".json")]
    assert [(j["backend"], j["step"], j["members"]) for j in jobs] == [("batch", "train", 2)]
    result = run["join"].task.data.result
    assert result["checkpoint"].startswith("s3://stoker-bucket/stoker/checkpoints/")
    assert run["start"].task.data.data.url.startswith("s3://stoker-bucket/stoker/datasets/"), "nodes read S3"
    export = run["export"].task.data.export_dir
    assert export == f"s3://stoker-bucket/stoker/exports/LlamaPretrain/{run.id}"
    keys = [o["Key"] for o in aws.client("s3").list_objects_v2(Bucket="stoker-bucket",
                                                                Prefix=export[len("s3://stoker-bucket/"):])["Contents"]]
    assert any(k.endswith("config.json") for k in keys) and any(k.endswith(".safetensors") for k in keys)
    assert not (tmp_path / "s3:").exists(), "nothing written to a local folder named after the URL"
    assert_bitwise_equal(final_weights(result["checkpoint"]), final_weights(reference["checkpoint"]))


@pytest.mark.aws
def test_a_rank_killed_on_an_emulated_batch_node_resubmits_the_gang_and_resumes_bitwise(reference, aws, tmp_path):
    """A training rank of the Batch multi-node job dies: the job fails, @retry submits a new one, which resumes
    from the last checkpoint committed in S3 (moto) and ends bitwise where an uninterrupted run does."""
    from tests.batch_emulator import emulated_batch_env

    env = emulated_batch_env(aws, tmp_path)
    proc = subprocess.Popen([sys.executable, str(FLOW), "run", *SMALL, "--backend", "batch=train"], cwd=tmp_path,
                            env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    s3, deadline = aws.client("s3"), time.time() + 600
    while not any(o["Key"].endswith("/latest") for o in s3.list_objects_v2(
            Bucket="stoker-bucket", Prefix="stoker/checkpoints/").get("Contents", [])):
        assert proc.poll() is None and time.time() < deadline, "no checkpoint committed in S3"
        time.sleep(0.2)
    victims = [p for p in psutil.Process(proc.pid).children(recursive=True)
               if p.name() == "stoker-rank3"  # forked from the node's warm launcher (a local gang's default)
               or ("stoker.train" in " ".join(p.cmdline()) and "torch.distributed.run" not in " ".join(p.cmdline())
                   and p.environ().get("RANK") == "3")]
    assert victims, "rank 3 must be running on node 1"
    victims[0].send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-4000:]
    os.environ.update(STOKER_HOME=env["STOKER_HOME"], STOKER_STORE=env["STOKER_STORE"])
    try:
        from stoker import Flow
        from stoker.store.blobs import open_store

        run = Flow("LlamaPretrain").latest_run
        store = open_store(env["STOKER_STORE"])
        jobs = sorted((json.loads(store.read(n)) for n in store.list(f"runs/LlamaPretrain/{run.id}/jobs/")
                       if n.endswith(".json")), key=lambda j: j["attempt"])
        result = run["join"].task.data.result
    finally:
        os.environ.pop("STOKER_STORE")
    assert [(j["step"], j["attempt"], j["members"]) for j in jobs] == [("train", 0, 2), ("train", 1, 2)]
    assert "node 1" in out and result["resumed_from"].startswith("s3://stoker-bucket/stoker/checkpoints/")
    assert_bitwise_equal(final_weights(result["checkpoint"]), final_weights(reference["checkpoint"]))


@pytest.mark.slurm
def test_a_rank_killed_on_a_slurm_node_resubmits_the_gang_and_resumes_bitwise(reference, home, slurm_cluster):
    before = {p.name for p in _ckpt_root(home).iterdir()}
    proc = _start(home, "--backend", "slurm=train", env={"STOKER_SHARED_PATHS": str(home)})
    run_id = _wait_for_new_checkpoint(home, before, proc).name
    victims = []
    for p in psutil.process_iter(["cmdline", "name"]):
        cmd = " ".join(p.info["cmdline"] or [])
        try:
            env = p.environ()  # what the process was started with (a forked rank: its warm launcher's)
        except psutil.Error:
            continue
        if env.get("STOKER_RUN_ID") != run_id:
            continue
        if p.info["name"] == "stoker-rank3" \
                or ("stoker.train" in cmd and "torch.distributed.run" not in cmd and env.get("RANK") == "3"):
            victims.append(p)  # forked from the node's warm launcher (every node here is this host), or torchrun's
    assert victims, "rank 3 must be running under slurmstepd"
    victims[0].send_signal(signal.SIGKILL)  # from outside the run: its Slurm job must end, then be resubmitted
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-4000:]
    gangs = _slurm_jobs(home, run_id, "train")
    assert [g["attempt"] for g in gangs] == [0, 1], "the gang was resubmitted as one job"
    run = client(home)[run_id]
    assert all(t.retry_count == 1 for t in run["train"])
    result = run["join"].task.data.result
    assert result["resumed_from"], "the retry resumed from the committed checkpoint"
    assert_bitwise_equal(final_weights(result["checkpoint"]), final_weights(reference["checkpoint"]))
