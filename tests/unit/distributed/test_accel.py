"""The node side of accelerators: EFA / Neuron variables, detection, nproc_per_node, flag overrides.

No Neuron device, `neuron-ls` or GPU exists on this machine: a folder with files named `neuron0..` stands in
for `/dev`, a text file for the DMI product name, and small executable scripts on a PATH of the test's own
for `neuron-ls` and `nvidia-smi` (they print what the real tools print). Everything else is the real code.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from stoker import FlowSpec, resources, step, torchrun
from stoker.backends.aws.decorator import batch
from stoker.distributed.accel import (
    EFA_ENV,
    NEURON_CACHE_DIR,
    Accelerators,
    cores_per_device,
    detect,
    node_env,
    parse_neuron_ls,
    step_request,
)
from stoker.distributed.torchrun import TorchrunHelper, derive_nproc_per_node, override_args
from stoker.errors import ConfigError
from stoker.features.torchrun import helper_for
from stoker.flow.current import ParallelInfo, current
from stoker.runtime.member.node import apply_node_env

NONE = Accelerators()


def fake_tool(bin_dir: Path, name: str, stdout: str, code: int = 0) -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.write({stdout!r})\nsys.exit({code})\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def fake_dev(tmp: Path, n: int) -> str:
    dev = tmp / "dev"
    dev.mkdir()
    for i in range(n):
        (dev / f"neuron{i}").touch()
    (dev / "null").touch()
    (dev / "neuron_monitor").touch()  # not a device node of the pattern neuronN
    return str(dev)


def dmi(tmp: Path, name: str) -> str:
    p = tmp / "product_name"
    p.write_text(name + "\n")
    return str(p)


# --- node_env ---------------------------------------------------------------------------------------------
def test_efa_variables_only_when_efa_is_asked_for():
    assert node_env({"efa": 8}, {}, neuron_devices=0) == EFA_ENV
    assert node_env({"efa": 0, "cpu": 4}, {}, neuron_devices=0) == {}
    assert node_env({}, {}, neuron_devices=0) == {}


def test_neuron_variables_for_trainium_inferentia_or_devices_on_the_node():
    want = {"NEURON_FUSE_SOFTMAX": "1", "NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS": "3", "MALLOC_ARENA_MAX": "64",
            "NEURON_COMPILE_CACHE_URL": NEURON_CACHE_DIR}
    training = {**want, "NEURON_CC_FLAGS": "--model-type transformer"}
    assert node_env({"trainium": 16}, {}, neuron_devices=0) == training  # what NxD's training scripts export
    assert node_env({"inferentia": 1}, {}, neuron_devices=0) == want  # inference: no training compiler flags
    assert node_env({}, {}, neuron_devices=16) == training  # a step without resources on a trn node
    both = node_env({"trainium": 16, "efa": 8}, {}, neuron_devices=16)
    assert both == {**EFA_ENV, **training}
    assert "NEURON_RT_NUM_CORES" not in both and not any(k.startswith("XLA_") for k in both)


def test_the_users_values_are_never_overridden():
    env = {"FI_EFA_USE_DEVICE_RDMA": "0", "MALLOC_ARENA_MAX": "128", "NEURON_COMPILE_CACHE_URL": "/fsx/cache"}
    got = node_env({"trainium": 16, "efa": 8}, env, neuron_devices=16)
    assert not set(got) & set(env)
    assert got["FI_PROVIDER"] == "efa" and got["NEURON_FUSE_SOFTMAX"] == "1"
    # --cache_dir in NEURON_CC_FLAGS wins over NEURON_COMPILE_CACHE_URL (Neuron's rule): do not add the URL
    flags = {"NEURON_CC_FLAGS": "--model-type transformer --cache_dir=/fsx/neuron"}
    assert "NEURON_COMPILE_CACHE_URL" not in node_env({"trainium": 1}, flags, neuron_devices=1)


def test_the_node_entrypoint_applies_the_unit_documents_request():
    """runtime/member/node.py reads `resources` (@resources) and `options` (@batch) from the unit spec document."""
    env = {"FI_PROVIDER": "tcp"}
    added = apply_node_env({"resources": {"cpu": 4}, "options": {"trainium": 16, "efa": 8}}, env)
    assert env["FI_PROVIDER"] == "tcp" and "FI_PROVIDER" not in added  # the user's choice stays
    assert env["FI_EFA_FORK_SAFE"] == "1" and env["NEURON_FUSE_SOFTMAX"] == "1"
    assert apply_node_env({}, {}) in ({}, node_env({}, {}))  # an old document without the keys still works


# --- requests ---------------------------------------------------------------------------------------------
def test_each_count_is_the_larger_of_resources_and_batch():
    got = step_request({"cpu": 8, "trainium": 2, "memory": 1000}, {"cpu": 4, "trainium": 16, "efa": 8,
                                                                      "instance_type": "trn1.32xlarge", "queue": "q"})
    assert got == {"cpu": 8, "trainium": 16, "efa": 8, "instance_type": "trn1.32xlarge"}


def test_cores_per_device_per_family():
    assert cores_per_device("trn1.32xlarge") == cores_per_device("trn1n.32xlarge") == 2
    assert cores_per_device("inf2.48xlarge") == 2
    assert cores_per_device("trn2.48xlarge") == 4  # LNC=2, the SDK's default
    assert cores_per_device("trn2.48xlarge", {"NEURON_LOGICAL_NC_CONFIG": "1"}) == 8
    assert cores_per_device("p5.48xlarge") is None and cores_per_device(None) is None


# --- detection --------------------------------------------------------------------------------------------
def test_detects_neuron_devices_times_the_cores_of_the_instance_type(tmp_path):
    env = {"PATH": str(tmp_path / "empty-bin")}
    acc = detect(env, dev_dir=fake_dev(tmp_path, 16), dmi_path=dmi(tmp_path, "trn1.32xlarge"))
    assert (acc.neuron_devices, acc.neuron_cores, acc.cores_per_device) == (16, 32, 2)
    assert "16" in acc.neuron_source and "trn1.32xlarge" in acc.neuron_source
    assert acc.instance_type == "trn1.32xlarge"


def test_unknown_instance_type_assumes_two_cores_and_says_so(tmp_path):
    acc = detect({"PATH": ""}, dev_dir=fake_dev(tmp_path, 4), dmi_path=str(tmp_path / "missing"))
    assert acc.neuron_cores == 8 and "assumed" in acc.neuron_source and "instance_type" in acc.neuron_source


def test_neuron_ls_is_believed_first(tmp_path):
    devices = [{"neuron_device": i, "nc_count": 4, "memory_size": 103079215104} for i in range(16)]
    fake_tool(tmp_path / "bin", "neuron-ls", json.dumps(devices))
    acc = detect({"PATH": str(tmp_path / "bin")}, dev_dir=fake_dev(tmp_path, 16),
                 dmi_path=dmi(tmp_path, "trn1.32xlarge"))  # neuron-ls (trn2 at LNC=2) beats the table
    assert (acc.neuron_cores, acc.cores_per_device) == (64, 4) and acc.neuron_source.startswith("neuron-ls")
    assert parse_neuron_ls("not json") is None and parse_neuron_ls('{"neuron_devices": [{"nc_count": 2}]}') == [2]


def test_gpus_from_cuda_visible_devices_or_nvidia_smi(tmp_path):
    fake_tool(tmp_path / "bin", "nvidia-smi", "GPU 0: NVIDIA H100 (UUID: GPU-a)\n"
                                              "  MIG 1g.10gb Device 0: (UUID: MIG-b)\n"
                                              "GPU 1: NVIDIA H100 (UUID: GPU-c)\n")
    path = str(tmp_path / "bin")
    acc = detect({"PATH": path}, dev_dir=str(tmp_path / "nodev"))
    assert (acc.gpus, acc.neuron_cores) == (2, 0) and "nvidia-smi" in acc.gpu_source
    assert detect({"PATH": path, "CUDA_VISIBLE_DEVICES": "3"}, dev_dir=str(tmp_path)).gpus == 1
    assert detect({"PATH": path, "CUDA_VISIBLE_DEVICES": ""}, dev_dir=str(tmp_path)).gpus == 0
    fake_tool(tmp_path / "bad", "nvidia-smi", "NVIDIA-SMI has failed", code=9)
    assert detect({"PATH": str(tmp_path / "bad")}, dev_dir=str(tmp_path)).gpus == 0


# --- nproc_per_node ---------------------------------------------------------------------------------------
def test_nproc_follows_the_neuron_cores_of_the_instance_never_a_silent_one():
    n, src = derive_nproc_per_node({}, {"trainium": 16, "instance_type": "trn1.32xlarge"}, accelerators=NONE)
    assert (n, src) == (32, "@batch(trainium=16) x 2 NeuronCores per device (trn1.32xlarge)")
    n, src = derive_nproc_per_node({"trainium": 16}, {"instance_type": "trn2.48xlarge"}, accelerators=NONE)
    assert n == 64 and src.startswith("@resources(trainium=16)")
    detected = Accelerators(neuron_devices=16, neuron_cores=64, cores_per_device=4, neuron_source="neuron-ls: x")
    n, src = derive_nproc_per_node({}, {"trainium": 16}, accelerators=detected)
    assert n == 64 and "detected: neuron-ls" in src
    n, src = derive_nproc_per_node({}, {"trainium": 16}, accelerators=NONE)
    assert n == 32 and "assumed" in src  # no type, nothing seen: 2 per device, said so


def test_nproc_from_gpus_cpus_or_what_the_node_has():
    assert derive_nproc_per_node({"gpu": 4}, {"gpu": 8}, accelerators=NONE) == (8, "@batch(gpu=8)")
    assert derive_nproc_per_node({"cpu": 2}, None, accelerators=NONE) == (2, "@resources(cpu=2)")
    trn = Accelerators(neuron_devices=16, neuron_cores=32, cores_per_device=2, neuron_source="16 devices")
    assert derive_nproc_per_node({}, None, accelerators=trn) == (32, "no @resources; detected 16 devices")
    gpus = Accelerators(gpus=8, gpu_source="8 GPUs from nvidia-smi -L")
    assert derive_nproc_per_node(None, {"queue": "q"}, accelerators=gpus)[0] == 8
    n, src = derive_nproc_per_node({}, None, accelerators=NONE)
    assert n == 1 and "no GPU or Neuron device" in src and "nproc_per_node" in src


def test_detection_is_lazy_when_the_request_decides():
    def boom() -> Accelerators:
        raise AssertionError("the node was probed although the request was enough")

    assert derive_nproc_per_node({"gpu": 2}, None, accelerators=boom)[0] == 2
    assert derive_nproc_per_node({}, {"trainium": 1, "instance_type": "trn1.2xlarge"}, accelerators=boom)[0] == 2


class Steps(FlowSpec):
    @step
    def start(self):
        self.next(self.train, num_parallel=2)

    @batch(trainium=16, efa=8, instance_type="trn1.32xlarge", memory=480000)
    @resources(cpu=8)
    @torchrun(precompile={"steps_this_run": 2}, neuron_cache="neuron-cache/llama7b/")
    @step
    def train(self):
        self.next(self.join)

    @torchrun(nproc_per_node=3, neuron_cache=None)
    @step
    def other(self):
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


def test_the_helper_reads_batch_resources_and_torchrun_settings():
    par = ParallelInfo(main_ip="10.0.0.1", num_nodes=4, node_index=2, port=41000)
    h = helper_for(Steps.train, par)
    assert h.resolved_nproc() == (32, "@batch(trainium=16) x 2 NeuronCores per device (trn1.32xlarge)")
    assert h.request["efa"] == 8 and h.uses_neuron()
    assert h.precompile == {"steps_this_run": 2} and h.neuron_cache == "neuron-cache/llama7b/"
    cmd = h.command("run_llama_nxd.py", {"tensor_parallel_size": 8, "use_zero_1": True})
    assert cmd[cmd.index("-m") + 1] == "torch.distributed.run"
    assert "--nnodes=4" in cmd and "--node_rank=2" in cmd and "--nproc_per_node=32" in cmd
    assert "--master_addr=10.0.0.1" in cmd and "--master_port=41000" in cmd
    assert cmd[-4:] == ["run_llama_nxd.py", "--tensor_parallel_size", "8", "--use_zero_1"]
    assert "--rdzv_conf=timeout=600" in cmd, "@torchrun's all_nodes_started_timeout bounds the rendezvous"
    os.environ["STOKER_RDZV_TIMEOUT"] = "3600"  # what the Batch backend gives the nodes of a multi-node job
    try:
        assert "--rdzv_conf=timeout=3600" in helper_for(Steps.train, par).command("x.py")
    finally:
        del os.environ["STOKER_RDZV_TIMEOUT"]
    other = helper_for(Steps.other, par)
    assert other.resolved_nproc() == (3, "@torchrun(nproc_per_node=...)") and other.neuron_cache is None


def test_the_compile_cache_goes_to_the_tasks_own_store():
    current._set(store_url="s3://bucket/store")  # what the task entrypoint sets for every task
    try:
        h = helper_for(Steps.train, ParallelInfo())
    finally:
        current._clear()
    assert h.store_url == "s3://bucket/store"


# --- flags of the pre-compilation pass --------------------------------------------------------------------
def test_override_args_replaces_flags_whatever_their_form():
    base = ["--tensor_parallel_size", "8", "--steps_this_run", "-1", "--use_zero_1", "--lr=3e-4", "--sizes", "4K",
            "1M"]
    got = override_args(base, {"steps_this_run": 2, "lr": 1e-3, "use_zero_1": False, "sizes": "8K"})
    assert got == ["--tensor_parallel_size", "8", "--steps_this_run", "2", "--lr", "0.001", "--sizes", "8K"]
    assert override_args({"max_steps": 100, "use_zero_1": True}, {"max_steps": 10}) == \
        ["--use_zero_1", "--max_steps", "10"]
    assert override_args(None, {"--flag": True}) == ["--flag"]
    with pytest.raises(ConfigError, match="not one string"):
        override_args("--max_steps 10", {})


def test_precompile_without_neuron_parallel_compile_names_the_fix(tmp_path):
    h = TorchrunHelper(nnodes=1, node_rank=0, master_addr="127.0.0.1", master_port=29500, nproc_per_node=1,
                       neuron=False)
    with pytest.raises(ConfigError, match="neuron_parallel_compile on PATH"):
        h.run("train.py", env={"PATH": str(tmp_path)}, precompile=True)
    with pytest.raises(ConfigError, match="precompile=3"):
        h.run("train.py", precompile=3)
    assert os.environ.get("FI_PROVIDER") != "efa"  # nothing leaked into this process


def test_more_processes_than_cores_or_gpus_is_refused():
    from stoker.distributed.accel import nproc_problem

    trn = {"trainium": 16, "instance_type": "trn1.32xlarge"}
    assert nproc_problem(32, trn) is None
    assert "16 trainium devices of a trn1.32xlarge have 32 NeuronCores" in nproc_problem(64, trn)
    assert "asks for 8 GPUs a node" in nproc_problem(16, {"gpu": 8})
    assert nproc_problem(64, {"trainium": 16}) is None  # cores per device unknown here: the node decides


def test_a_failed_torchrun_is_named_by_its_entrypoint_not_its_whole_command():
    from stoker.distributed.torchrun import _short

    cmd = ["/p/python", "-m", "torch.distributed.run", "--nnodes=2", "--rdzv_conf=timeout=600", "train.py",
           *(["--flag", "x" * 50] * 20)]
    assert _short(cmd) == "torchrun ... train.py"
    assert _short(["/p/python", "-m", "torch.distributed.run", "--nnodes=2", "-m", "stoker.train"]) \
        == "torchrun ... -m stoker.train"
