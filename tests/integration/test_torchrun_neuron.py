"""`current.torch.run(entrypoint=...)` runs any torchrun script, flags and all, as the Metaflow Trainium flow
runs the Neuron samples' NxD pretraining script; on Neuron nodes the compile cache travels through the store
and `precompile=` runs a `neuron_parallel_compile` pass first.

Real: torchrun, a gloo process group, the flow engine, the blob store, the processes and their environment.
Stand-ins, because no Neuron SDK or device exists here: `run_llama_nxd.py` below takes the NxD script's flags
and "compiles" into the cache folder in neuronx-cc's layout (a flock()ed lock while it writes, `model.done`
at the end) instead of running neuronx-cc; `neuron_parallel_compile` is a small executable on the test's PATH
that logs its command line and runs it with `NEURON_EXTRACT_GRAPHS_ONLY=1`, as the real one does.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
from pathlib import Path

import pytest

from stoker.distributed import neuron_cache as nc
from stoker.distributed.torchrun import TorchrunHelper
from stoker.errors import StokerError
from stoker.store.blobs import open_store
from tests.helpers import run_flow

pytestmark = [pytest.mark.slow, pytest.mark.torch]

SCRIPT = r'''
"""Stand-in for the Neuron samples' NxD Llama pretraining script: its flags, a real process group."""
import argparse, fcntl, hashlib, json, os, sys
from pathlib import Path

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--model_path")
ap.add_argument("--data_dir")
ap.add_argument("--tensor_parallel_size", type=int, default=8)
ap.add_argument("--batch_size", type=int, default=1)
ap.add_argument("--max_steps", type=int, default=10000)
ap.add_argument("--steps_this_run", type=int, default=-1)
ap.add_argument("--seq_len", type=int, default=4096)
ap.add_argument("--lr", type=float, default=3e-4)
ap.add_argument("--use_zero_1", action="store_true")
ap.add_argument("--use_mix_precision", action="store_true")
ap.add_argument("--sequence_parallel_enabled", action="store_true")
ap.add_argument("--output_dir", required=True)
ap.add_argument("--fail", action="store_true")
a = ap.parse_args()

dist.init_process_group("gloo")
world = dist.get_world_size()
assert world % a.tensor_parallel_size == 0, f"world size {world} is not a multiple of TP {a.tensor_parallel_size}"
t = torch.ones(1)
dist.all_reduce(t)
assert t.item() == world
extract_only = os.environ.get("NEURON_EXTRACT_GRAPHS_ONLY") == "1"
hit = None
cache = os.environ.get("NEURON_COMPILE_CACHE_URL")
if cache and os.environ["LOCAL_RANK"] == "0":  # one compiler per node, as every node has its own cache
    graph = f"{a.tensor_parallel_size}-{a.batch_size}-{a.seq_len}"  # not the step counts: same graph
    entry = Path(cache) / "neuronxcc-2.0.0+fake" / ("MODULE_" + hashlib.sha1(graph.encode()).hexdigest()[:16]
                                                   + "+d41d8cd9")
    hit = (entry / "model.done").exists()
    if not hit:
        entry.mkdir(parents=True, exist_ok=True)
        fd = os.open(entry / "model.hlo_module.pb.lock", os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        (entry / "model.hlo_module.pb").write_bytes(graph.encode() * 64)
        (entry / "model.neff").write_bytes(b"NEFF" + graph.encode() * 256)
        (entry / "model.done").write_text("")
        os.unlink(entry / "model.hlo_module.pb.lock")
        os.close(fd)
if os.environ["LOCAL_RANK"] == "0":
    keys = ("FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "FI_EFA_FORK_SAFE", "NEURON_FUSE_SOFTMAX",
            "NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS", "MALLOC_ARENA_MAX", "NEURON_COMPILE_CACHE_URL")
    mode = "precompile" if extract_only else "train"
    out = Path(a.output_dir) / f"{mode}-node{os.environ['GROUP_RANK']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(a), "world": world, "cache_hit": hit,
                               "env": {k: os.environ.get(k) for k in keys}}))
dist.barrier()
dist.destroy_process_group()
sys.exit(3 if a.fail else 0)
'''

FAKE_NPC = f'''#!{sys.executable}
import json, os, subprocess, sys
with open(os.environ["FAKE_NPC_LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
sys.exit(subprocess.call(sys.argv[1:], env={{**os.environ, "NEURON_EXTRACT_GRAPHS_ONLY": "1"}}))
'''

FLOW = '''
import json, os
from stoker import FlowSpec, current, step, torchrun


class NxdFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train, num_parallel=2)

    @torchrun(nproc_per_node=2)
    @step
    def train(self):
        out = os.path.join(current.tempdir, "out")
        current.torch.run(entrypoint="run_llama_nxd.py",
                          args={"tensor_parallel_size": 2, "batch_size": 1, "max_steps": 10, "use_zero_1": True,
                                "seq_len": 128, "lr": 1e-4, "output_dir": out})
        self.report = json.load(open(os.path.join(out, f"train-node{current.parallel.node_index}.json")))
        self.next(self.join)

    @step
    def join(self, inputs):
        self.reports = [i.report for i in inputs]
        self.next(self.end)

    @step
    def end(self):
        print("nxd reports", len(self.reports))


if __name__ == "__main__":
    NxdFlow()
'''

ARGS = {"model_path": "/opt/llama", "data_dir": "/data/wikicorpus", "tensor_parallel_size": 2, "batch_size": 1,
        "max_steps": 10000, "steps_this_run": -1, "seq_len": 256, "use_zero_1": True, "use_mix_precision": True,
        "sequence_parallel_enabled": True}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_flow_runs_the_nxd_script_with_its_flags_on_every_node(tmp_path):
    (tmp_path / "run_llama_nxd.py").write_text(SCRIPT)
    (tmp_path / "nxd_flow.py").write_text(FLOW)
    p = run_flow(tmp_path / "nxd_flow.py", "run", cwd=tmp_path)
    assert "nxd reports 2" in p.stdout
    assert p.stdout.count("2 processes per node (@torchrun(nproc_per_node=...))") == 2
    from stoker import Flow

    reports = Flow("NxdFlow").latest_run["join"].task.data.reports
    assert [r["world"] for r in reports] == [4, 4]
    assert all(r["args"]["tensor_parallel_size"] == 2 and r["args"]["use_zero_1"] and r["args"]["max_steps"] == 10
               for r in reports)
    assert all(r["env"]["FI_PROVIDER"] is None for r in reports)  # no EFA asked, none set


@pytest.fixture()
def neuron_node(tmp_path):
    """A helper as a trn1.2xlarge node with an EFA interface would build it: the script, a fake
    neuron_parallel_compile on PATH, a local store."""
    script = tmp_path / "run_llama_nxd.py"
    script.write_text(SCRIPT)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    npc = bin_dir / "neuron_parallel_compile"
    npc.write_text(FAKE_NPC)
    npc.chmod(npc.stat().st_mode | stat.S_IXUSR)
    store_url = str(tmp_path / "store")

    def node(cache: Path) -> tuple[TorchrunHelper, dict[str, str]]:
        helper = TorchrunHelper(nnodes=1, node_rank=0, master_addr="127.0.0.1", master_port=free_port(),
                                resources={"trainium": 1}, options={"instance_type": "trn1.2xlarge", "efa": 1},
                                store_url=store_url, neuron_cache="neuron-cache/nxd/")
        env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "NEURON_COMPILE_CACHE_URL": str(cache),
               "FAKE_NPC_LOG": str(tmp_path / "npc.log")}
        return helper, env

    return script, node, open_store(store_url)


def test_neuron_precompile_then_train_with_the_cache_kept_in_the_store(tmp_path, neuron_node, capfd):
    script, node, store = neuron_node
    helper, env = node(tmp_path / "cache-1")
    out = tmp_path / "out-1"
    helper.run(str(script), args={**ARGS, "output_dir": str(out)}, env=env, precompile={"steps_this_run": 2})
    log = capfd.readouterr().out
    assert "2 processes per node (@resources(trainium=1) x 2 NeuronCores per device (trn1.2xlarge))" in log
    assert "node environment FI_EFA_FORK_SAFE=1 FI_EFA_USE_DEVICE_RDMA=1 FI_PROVIDER=efa" in log
    assert "pre-compilation pass (neuron_parallel_compile with --steps_this_run 2)" in log

    (npc_cmd,) = [json.loads(line) for line in (tmp_path / "npc.log").read_text().splitlines()]
    assert npc_cmd[1:3] == ["-m", "torch.distributed.run"] and "--nproc_per_node=2" in npc_cmd
    assert npc_cmd[npc_cmd.index("--steps_this_run") + 1] == "2"
    pre = json.loads((out / "precompile-node0.json").read_text())
    train = json.loads((out / "train-node0.json").read_text())
    assert pre["args"]["steps_this_run"] == 2 and pre["cache_hit"] is False  # the pass compiled the graph
    assert train["args"]["steps_this_run"] == -1 and train["cache_hit"] is True  # the real run found it
    assert train["args"]["max_steps"] == 10000 and train["args"]["use_zero_1"] and train["world"] == 2
    assert train["env"] == {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1",
                            "NEURON_FUSE_SOFTMAX": "1", "NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS": "3",
                            "MALLOC_ARENA_MAX": "64", "NEURON_COMPILE_CACHE_URL": str(tmp_path / "cache-1")}
    stored = store.list("neuron-cache/nxd/")
    assert sorted(n.rpartition("@")[0].rsplit("/", 1)[1] for n in stored) == \
        ["model.done", "model.hlo_module.pb", "model.neff"]

    # the next job, on a fresh node whose disk holds what a killed compiler left: the store's cache wins
    cache2 = tmp_path / "cache-2"
    module = Path(stored[0].removeprefix("neuron-cache/nxd/")).parent
    (cache2 / module).mkdir(parents=True)
    (cache2 / module / "model.hlo_module.pb.lock").write_text("")  # nobody holds it any more
    (cache2 / module.parent / "MODULE_killed+d41d8cd9").mkdir()
    (cache2 / module.parent / "MODULE_killed+d41d8cd9" / "model.log").write_text("interrupted")
    helper, env = node(cache2)
    helper.run(str(script), args={**ARGS, "output_dir": str(tmp_path / "out-2")}, env=env)
    again = json.loads((tmp_path / "out-2" / "train-node0.json").read_text())
    assert again["cache_hit"] is True  # no compilation: fetched before training
    assert not list(cache2.rglob("*.lock")) and not (cache2 / module.parent / "MODULE_killed+d41d8cd9").exists()
    assert "neuron cache: fetched 3 files" in capfd.readouterr().out
    assert len((tmp_path / "npc.log").read_text().splitlines()) == 1  # no precompile asked this time


def test_a_failed_run_still_uploads_what_it_compiled(tmp_path, neuron_node, capfd):
    script, node, store = neuron_node
    helper, env = node(tmp_path / "cache")
    with pytest.raises(StokerError, match="torchrun exited with code"):
        helper.run(str(script), args={**ARGS, "seq_len": 512, "fail": True, "output_dir": str(tmp_path / "o")},
                   env=env)
    assert len(nc.remote_index(store, "neuron-cache/nxd/")) == 3
    assert "neuron cache: uploaded 3 files" in capfd.readouterr().out
