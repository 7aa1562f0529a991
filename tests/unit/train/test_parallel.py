"""Multi-process training under real torchrun + gloo (2 ranks): TP=2 (with and without sequence
parallel, with and without loss parallel), ZeRO-1 over 2 ranks and FSDP2 over 2 ranks match a single-process
reference; a run stopped at step k and resumed gives bitwise the same weights at step n as an uninterrupted one,
and a checkpoint resumes on another data-parallel size (1 -> 2 -> 1 ranks, 1 -> 4 ranks; FSDP2 2 -> 4) with the
same global batch. One test runs 4 ranks as a (dp=2, tp=2) mesh."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

from stoker.errors import CheckpointError
from stoker.train.model import Llama
from stoker.train.settings import get_model_config
from stoker.train.trainer import run_training

pytestmark = pytest.mark.slow
torch.set_num_threads(1)

STEPS, STOP = 4, 2

# one torchrun launch runs several jobs in the same process group (process start-up dominates on CPU)
# stoker is imported before the group exists, as `python -m stoker.train` does: imported later, torch's
# torch.distributed.nn.functional (DCP imports it) takes the default group as its functions' default arguments
# and keeps it, with its gloo threads, to the interpreter's exit. After the group is destroyed no gloo thread may
# be left: one still alive at exit can abort a finished run ("terminate called without an active exception").
WORKER = textwrap.dedent("""
    import json, os, sys, time
    import torch, torch.distributed as dist
    from stoker.train.trainer import run_training
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    jobs = json.load(open(sys.argv[1]))
    results = []
    for job in jobs:
        r = run_training(job)
        r.pop("config")
        results.append(r)
    if dist.get_rank() == 0:
        json.dump(results, open(sys.argv[2], "w"))
    dist.barrier()  # no rank tears its connections down while another still uses them
    dist.destroy_process_group()

    def gloo_threads():
        names = []
        for tid in os.listdir("/proc/self/task"):
            try:
                names.append(open(f"/proc/self/task/{tid}/comm").read().strip())
            except OSError:  # exited meanwhile
                pass
        return [n for n in names if "gloo" in n]

    if os.path.isdir("/proc/self/task"):
        deadline = time.monotonic() + 5
        while gloo_threads() and time.monotonic() < deadline:
            time.sleep(0.05)
        if gloo_threads():
            sys.exit(f"gloo threads outlive destroy_process_group: {gloo_threads()}")
""")


def token_file(path: Path) -> Path:
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, size=97)
    toks = np.concatenate([np.roll(base, i % 5) for i in range(22)]).astype(np.uint16)  # 64 blocks of 33
    toks.tofile(path)
    return path


def job(tmp: Path, data: Path, name: str, **sections) -> dict:
    cfg = {
        "out_dir": str(tmp / name),
        "data": {"url": str(data), "block_size": 33},
        "train": {"steps": STEPS, "micro_batch_size": 4, "global_batch_size": 8, "lr": 3e-3, "warmup_steps": 2,
                  "log_every": 2, "seed": 5},
        "metrics": {"progress": False, "tensorboard": False},
    }
    for key, value in sections.items():
        cfg.setdefault(key, {}).update(value)
    return cfg


def torchrun(tmp: Path, jobs: list[dict], timeout: int = 300, nproc: int = 2) -> list[dict]:
    script, jobs_file, out = tmp / "worker.py", tmp / "jobs.json", tmp / "results.json"
    script.write_text(WORKER)
    jobs_file.write_text(json.dumps(jobs))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--standalone",
           str(script), str(jobs_file), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(out.read_text())


def load_weights(ckpt: str) -> dict[str, torch.Tensor]:
    """Load a (possibly sharded) checkpoint's model into one process: it reshards to full tensors."""
    model = Llama(get_model_config("tiny"))
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=ckpt)
    return state["model"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("par")
    data = token_file(tmp / "tokens.bin")
    reference = run_training(job(tmp, data, "reference"))
    single_stop = run_training(job(tmp, data, "single_stop", train={"stop_after": STOP}))  # for elastic resumes
    reference["single_stop"] = single_stop["checkpoint"]
    return tmp, data, reference


def assert_resume_bitwise(uninterrupted: dict, stopped: dict, resumed: dict) -> None:
    assert stopped["step"] == STOP and stopped["checkpoint"].endswith("step_00000002")
    assert resumed["resumed_from"].endswith("step_00000002") and resumed["step"] == STEPS
    assert resumed["losses"] == uninterrupted["losses"][STOP:]  # exact, not approximate
    a, b = load_weights(uninterrupted["checkpoint"]), load_weights(resumed["checkpoint"])
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def assert_close_losses(got: list[float], want: list[float], steps: int = STEPS) -> None:
    assert len(got) == len(want) == steps
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4)


def assert_elastic_resume(resumed: dict, uninterrupted: dict) -> None:
    """Resumed on another data-parallel size: the same batches, so the same losses and weights up to
    the order of floating-point sums."""
    assert resumed["resumed_from"].endswith("step_00000002") and resumed["step"] == STEPS
    assert_close_losses(resumed["losses"], uninterrupted["losses"][STOP:], steps=STEPS - STOP)
    a, b = load_weights(uninterrupted["checkpoint"]), load_weights(resumed["checkpoint"])
    for key in a:
        torch.testing.assert_close(b[key], a[key], atol=1e-4, rtol=1e-3)


def test_tensor_parallel_matches_reference_and_resumes_bitwise(setup):
    tmp, data, reference = setup
    tp = {"parallel": {"tp": 2}}
    jobs = [
        job(tmp, data, "tp_full", **tp),
        job(tmp, data, "tp_resume", **tp, train={"stop_after": STOP}),
        job(tmp, data, "tp_resume", **tp),  # picks up the latest checkpoint of that folder
        job(tmp, data, "tp_sp", parallel={"tp": 2, "sequence_parallel": True, "activation_checkpoint": "selective"}),
        job(tmp, data, "tp_sp_resume", parallel={"tp": 2, "sequence_parallel": True},  # switch SP on at resume
            checkpoint={"resume_from": str(tmp / "tp_resume" / "checkpoints" / "step_00000002")}),
        job(tmp, data, "tp_gathered", parallel={"tp": 2, "loss_parallel": False}),  # the replicated logits
        job(tmp, data, "tp_tied", parallel={"tp": 2}, model={"tie_embeddings": True}),
        job(tmp, data, "tp_tied_gathered", parallel={"tp": 2, "loss_parallel": False}, model={"tie_embeddings": True}),
    ]
    (tmp / "tp").mkdir()
    full, stopped, resumed, sp, sp_resumed, gathered, tied, tied_gathered = torchrun(tmp / "tp", jobs)
    # loss parallel (the default: cross entropy on vocabulary-sharded logits) is the gathered loss up to fp32 rounding,
    # with the output layer tied to the embedding too
    np.testing.assert_allclose(full["losses"], gathered["losses"], rtol=1e-5, atol=0)
    np.testing.assert_allclose(tied["losses"], tied_gathered["losses"], rtol=1e-5, atol=0)
    assert tied["losses"][-1] < tied["losses"][0]
    assert_elastic_resume(sp_resumed, full)
    assert full["tp"] == 2 and full["dp"] == 1
    assert_close_losses(full["losses"], reference["losses"])
    assert_close_losses(sp["losses"], reference["losses"])
    assert reference["losses"][-1] < reference["losses"][0]  # it learns
    assert_resume_bitwise(full, stopped, resumed)
    # the TP checkpoint loads into one process and equals the reference weights closely
    ref_w, tp_w = load_weights(reference["checkpoint"]), load_weights(full["checkpoint"])
    for key in ref_w:
        torch.testing.assert_close(tp_w[key], ref_w[key], atol=1e-4, rtol=1e-3)


def test_zero1_matches_reference_and_resumes_bitwise(setup):
    tmp, data, reference = setup
    z = {"parallel": {"dp_mode": "zero1"}}
    jobs = [
        job(tmp, data, "z_full", **z),
        job(tmp, data, "z_resume", **z, train={"stop_after": STOP}),
        job(tmp, data, "z_resume", **z),
        job(tmp, data, "ddp", parallel={"dp_mode": "ddp"}),  # plain data parallel, unsharded AdamW
        job(tmp, data, "z_from_1", **z, checkpoint={"resume_from": reference["single_stop"]}),  # 1 rank -> 2
    ]
    (tmp / "z").mkdir()
    full, stopped, resumed, ddp, from_one = torchrun(tmp / "z", jobs)
    assert_close_losses(ddp["losses"], reference["losses"])
    assert full["dp"] == 2 and full["tp"] == 1 and full["global_batch_size"] == 8
    assert_close_losses(full["losses"], reference["losses"])
    assert_resume_bitwise(full, stopped, resumed)
    # each rank saved only its half of every optimizer moment (one DTensor, two chunks)
    meta = dcp.FileSystemReader(full["checkpoint"]).read_metadata().state_dict_metadata
    moment = meta["optim_flat.layers.0.attention.wq.weight.exp_avg"]
    assert [tuple(c.sizes) for c in moment.chunks] == [(1, 2048), (1, 2048)] and tuple(moment.size) == (1, 4096)
    # the same global batch on another data-parallel size: 1 -> 2 ranks, and 2 ranks -> 1 (accumulating 2)
    assert_elastic_resume(from_one, reference)
    to_one = run_training(job(tmp, data, "z_to_1", checkpoint={"resume_from": stopped["checkpoint"]}))
    assert to_one["dp"] == 1 and to_one["accum"] == 2
    assert_elastic_resume(to_one, full)


def test_fsdp2_matches_reference_and_resumes(setup):
    tmp, data, reference = setup
    f = {"parallel": {"dp_mode": "fsdp"}}
    asynchronous = {"async_save": True}  # background writes on their own gloo group, committed later
    jobs = [
        job(tmp, data, "f_full", **f),
        job(tmp, data, "f_resume", **f, train={"stop_after": STOP}, checkpoint=asynchronous),
        job(tmp, data, "f_resume", **f, checkpoint=asynchronous),
    ]
    (tmp / "f").mkdir()
    full, stopped, resumed = torchrun(tmp / "f", jobs)
    assert full["dp"] == 2
    assert_close_losses(full["losses"], reference["losses"])
    assert_resume_bitwise(full, stopped, resumed)
    # FSDP2's sharded state reshards too: the 2-rank checkpoint resumes on 4 ranks
    (tmp / "f4").mkdir()
    wider = job(tmp, data, "f4", **f, train={"micro_batch_size": 2}, checkpoint={"resume_from": stopped["checkpoint"]})
    (on_four,) = torchrun(tmp / "f4", [wider], nproc=4)
    assert on_four["dp"] == 4
    assert_elastic_resume(on_four, full)
    with pytest.raises(CheckpointError, match="FSDP state resumes only under dp_mode=fsdp with 2 or more"):
        run_training(job(tmp, data, "f1", **f, checkpoint={"resume_from": stopped["checkpoint"]}))  # one rank


def test_2d_mesh_zero1_and_fsdp_with_tp(setup):
    """4 ranks as (dp=2, tp=2): ZeRO-1 + TP and FSDP2 + TP + sequence parallel."""
    tmp, data, reference = setup
    z = {"parallel": {"tp": 2, "dp_mode": "zero1"}}
    jobs = [
        job(tmp, data, "d2_full", **z),
        job(tmp, data, "d2_resume", **z, train={"stop_after": STOP}),
        job(tmp, data, "d2_resume", **z),
        job(tmp, data, "d2_fsdp", parallel={"tp": 2, "dp_mode": "fsdp", "sequence_parallel": True}),
        job(tmp, data, "dp4_from_1", parallel={"dp_mode": "zero1"}, train={"micro_batch_size": 2},
            checkpoint={"resume_from": reference["single_stop"]}),  # 1 rank -> 4 ZeRO-1 ranks
    ]
    (tmp / "d2").mkdir()
    full, stopped, resumed, fsdp, dp4 = torchrun(tmp / "d2", jobs, nproc=4)
    assert dp4["dp"] == 4
    assert_elastic_resume(dp4, reference)
    assert (full["dp"], full["tp"], fsdp["dp"], fsdp["tp"]) == (2, 2, 2, 2)
    assert_close_losses(full["losses"], reference["losses"])
    assert_close_losses(fsdp["losses"], reference["losses"])
    assert_resume_bitwise(full, stopped, resumed)
