"""Flows on AWS Batch, emulated (tests/batch_emulator.py): the requests go to moto's Batch, S3 and CloudWatch
Logs on loopback; each node of a job is a local process with exactly the environment Batch gives it, which
pulls the code package and spec from the S3 store and writes its output to CloudWatch Logs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import EXAMPLES, run_flow

pytestmark = [pytest.mark.aws, pytest.mark.slow, pytest.mark.torch]


@pytest.fixture
def batch_env(aws, tmp_path):
    from tests.batch_emulator import emulated_batch_env

    return emulated_batch_env(aws, tmp_path)


def _store(env):
    os.environ["STOKER_HOME"] = env["STOKER_HOME"]
    from stoker.store.blobs import open_store

    return open_store(env["STOKER_STORE"])


def _jobs(env, flow: str, run_id: str) -> list[dict]:
    store = _store(env)
    names = [n for n in store.list(f"runs/{flow}/{run_id}/jobs/") if n.endswith(".json")]
    return sorted((json.loads(store.read(n)) for n in names), key=lambda r: (r["step"], r["attempt"]))


def _run_id(out: str) -> str:
    line = next(ln for ln in out.splitlines() if "stoker: run " in ln and " started" in ln)
    return line.split("stoker: run ")[1].split()[0].split("/")[1]


def _streams(aws) -> dict[str, str]:
    logs = aws.client("logs")
    out = {}
    for s in logs.describe_log_streams(logGroupName="/aws/batch/job")["logStreams"]:
        ev = logs.get_log_events(logGroupName="/aws/batch/job", logStreamName=s["logStreamName"], startFromHead=True)
        out[s["logStreamName"]] = "\n".join(e["message"] for e in ev["events"])
    return out


def test_allreduce_gang_as_one_multinode_job(aws, batch_env):
    p = run_flow(EXAMPLES / "allreduce.py", "run", "--backend", "batch=allreduce", cwd=batch_env["CWD"],
                 env=batch_env, timeout=300)
    assert "all_reduce OK on 4 ranks (gloo)" in p.stdout, p.stdout[-3000:]
    run_id = _run_id(p.stdout + p.stderr)
    jobs = _jobs(batch_env, "AllReduceFlow", run_id)
    assert [(j["step"], j["members"], j["kind"]) for j in jobs] == [("allreduce", 2, "gang")], "one job, 2 nodes"
    extra = jobs[0]["extra"]
    assert 0 < extra["stopped_at"] - extra["started_at"] < 120, "start and stop times, for the cost"
    # every node's output is in its own CloudWatch stream, and came back live, prefixed with the node
    streams = _streams(aws)
    assert len(streams) == 2
    assert sorted("node rank 0" in t for t in streams.values()) == [False, True]
    assert all("result OK" in t for t in streams.values())
    assert "[default0]:result OK: node rank 1, world size 4" in p.stdout
    logs = subprocess.run([sys.executable, "-m", "stoker.cli.main", "logs", f"AllReduceFlow/{run_id}/allreduce"],
                          env={**os.environ, **batch_env}, capture_output=True, text=True, timeout=60)
    assert " node 0] " in logs.stdout and " node 1] " in logs.stdout
    engine = subprocess.run([sys.executable, "-m", "stoker.cli.main", "logs", f"AllReduceFlow/{run_id}/allreduce",
                             "--engine"], env={**os.environ, **batch_env}, capture_output=True, text=True, timeout=60)
    assert engine.returncode == 0, engine.stderr
    lines = engine.stdout.splitlines()
    assert any(ln.startswith("[allreduce/") and " node 0 attempt 0] " in ln and "node rank 0" in ln for ln in lines)
    assert any(" node 1 attempt 0] " in ln and "result OK: node rank 1" in ln for ln in lines), engine.stdout


FAILING = '''
import os, sys, time
from stoker import FlowSpec, batch, current, parallel, retry, step


class GangFail(FlowSpec):
    @step
    def start(self):
        self.next(self.work, num_parallel=3)

    @retry(times={retries}, minutes_between_retries=0)
    @batch(cpu=1, memory=2048)
    @parallel
    @step
    def work(self):
        print(f"node {{current.parallel.node_index}} attempt {{current.retry_count}}", flush=True)
        if current.parallel.node_index == 1 and current.retry_count == 0:
            sys.exit(3)
        if current.retry_count == 0:
            time.sleep(120)
        self.node = current.parallel.node_index
        self.next(self.join)

    @step
    def join(self, inputs):
        self.nodes = sorted(i.node for i in inputs)
        self.next(self.end)

    @step
    def end(self):
        print("nodes", self.nodes)


if __name__ == "__main__":
    GangFail()
'''


def test_a_failed_node_names_itself_and_stops_the_gang(batch_env, tmp_path):
    flow = tmp_path / "gang_fail.py"
    flow.write_text(FAILING.format(retries=0))
    started = time.monotonic()
    p = run_flow(flow, "run", cwd=tmp_path, env=batch_env, timeout=300, check=False)
    took = time.monotonic() - started
    assert p.returncode != 0
    out = p.stdout + p.stderr
    assert "gang work: node 1 (task 3) failed: SystemExit: 3 (batch: node 1: exit code 1" in out, out[-3000:]
    assert took < 90, f"the other nodes sleep 120 s: the gang must be stopped (TerminateJob), took {took:.0f} s"


def test_retry_resubmits_the_whole_gang(batch_env, tmp_path):
    flow = tmp_path / "gang_fail.py"
    flow.write_text(FAILING.format(retries=1))
    p = run_flow(flow, "run", cwd=tmp_path, env=batch_env, timeout=300)
    assert "nodes [0, 1, 2]" in p.stdout, p.stdout[-3000:]
    jobs = _jobs(batch_env, "GangFail", _run_id(p.stdout + p.stderr))
    assert [(j["step"], j["attempt"], j["members"]) for j in jobs] == [("work", 0, 3), ("work", 1, 3)]


def _dry_run_doc(out: str, header: str) -> dict:
    doc = out.split(header + "\n", 1)[1]
    return json.loads(doc[: doc.index("\n}\n") + 2])


def test_dry_run_prints_the_batch_requests(batch_env):
    """`--with batch:...` with `--backend batch=STEP` configures only that step; the others stay here."""
    p = run_flow(EXAMPLES / "allreduce.py", "run", "--backend", "batch=allreduce", "--nodes", "4", "--with",
                 "batch:trainium=16,efa=8,instance_type=trn1.32xlarge", "--dry-run", cwd=batch_env["CWD"],
                 env=batch_env, timeout=120)
    assert "# ---- step start: local" in p.stdout and "# ---- step join: local" in p.stdout
    reqs = _dry_run_doc(p.stdout, "# ---- step allreduce: batch (gang, 4 member(s)) ----")
    assert reqs["SubmitJob"]["nodeOverrides"]["numNodes"] == 4
    env = {e["name"]: e["value"] for e in reqs["SubmitJob"]["nodeOverrides"]["nodePropertyOverrides"][0][
        "containerOverrides"]["environment"]}
    # the nodes get where the store's signing key is, never the key (the emulator gives them no STOKER_STORE_KEY)
    assert env["STOKER_STORE_KEY_SECRET"] == batch_env["STOKER_STORE_KEY_SECRET"]
    assert os.environ["STOKER_STORE_KEY"] not in p.stdout
    props = reqs["RegisterJobDefinition"]["nodeProperties"]
    assert props["mainNode"] == 0 and len(props["nodeRangeProperties"][0]["container"]["linuxParameters"][
        "devices"]) == 16 + 8


def test_the_trainium_example_dry_runs_as_the_recipe(batch_env, tmp_path):
    """Laid out as its docstring says (its @presubmit plan, which --dry-run runs, needs NxD's files next to it)."""
    import shutil

    folder, standin = tmp_path / "flow", Path(__file__).parents[1] / "nxd_standin"
    (folder / "7B_config_llama2").mkdir(parents=True)
    shutil.copy(EXAMPLES / "aws" / "llama2_trainium.py", folder)
    for f in ("tp_zero1_llama_hf_pretrain.py", "logger.py", "modeling_llama_nxd.py", "training_utils.py"):
        shutil.copy(standin / f, folder)
    shutil.copy(standin / "config.json", folder / "7B_config_llama2" / "config.json")
    p = run_flow(folder / "llama2_trainium.py", "run", "--nodes", "4", "--dry-run", cwd=batch_env["CWD"],
                 env=batch_env, timeout=120)
    reqs = _dry_run_doc(p.stdout, "# ---- step train: batch (gang, 4 member(s)) ----")
    c = reqs["RegisterJobDefinition"]["nodeProperties"]["nodeRangeProperties"][0]["container"]
    assert {"type": "MEMORY", "value": "480000"} in c["resourceRequirements"]
    assert c["linuxParameters"]["devices"][15]["hostPath"] == "/dev/neuron15"
    assert c["linuxParameters"]["devices"][-1]["hostPath"] == "/dev/infiniband/uverbs7"


def test_node_environment_is_what_batch_gives(batch_env, tmp_path):
    """The entrypoint reads only Batch's variables: the main node has no main-node address and uses its own."""
    from stoker.backends.aws.node import BATCH
    from stoker.runtime.member.nodeenv import node_identity

    main = node_identity({"AWS_BATCH_JOB_NODE_INDEX": "0", "AWS_BATCH_JOB_NUM_NODES": "4",
                          "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0", "AWS_BATCH_JOB_ID": "j#0"}, BATCH)
    other = node_identity({"AWS_BATCH_JOB_NODE_INDEX": "3", "AWS_BATCH_JOB_NUM_NODES": "4",
                           "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "10.0.1.5", "AWS_BATCH_JOB_ID": "j#3"},
                          BATCH)
    assert (main.member, main.num_nodes, main.port) == (0, 4, 29500) and main.main_addr
    assert (other.member, other.num_nodes, other.main_addr) == (3, 4, "10.0.1.5")
    assert sys.executable and Path(batch_env["BATCH_EMULATOR_DIR"]).name == "emulator"


SLEEPY = """
import time
from stoker import FlowSpec, batch, parallel, step


class Sleepy(FlowSpec):
    @step
    def start(self):
        self.next(self.work, num_parallel=2)

    @batch(cpu=1)
    @parallel
    @step
    def work(self):
        print("working", flush=True)
        time.sleep(300)
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    Sleepy()
"""


def test_stoker_kill_terminates_the_batch_job(batch_env, tmp_path):
    flow = tmp_path / "sleepy.py"
    flow.write_text(SLEEPY)
    env = {**os.environ, **batch_env}
    proc = subprocess.Popen([sys.executable, str(flow), "run"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    seen = ""
    deadline = time.monotonic() + 120
    while "working" not in seen and time.monotonic() < deadline:
        seen += proc.stdout.readline()
    assert "working" in seen, seen
    run_id = _run_id(seen)
    follow = subprocess.Popen([sys.executable, "-m", "stoker.cli.main", "logs", f"Sleepy/{run_id}", "--engine",
                               "--follow"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(3)
    kill = subprocess.run([sys.executable, "-m", "stoker.cli.main", "kill", f"Sleepy/{run_id}"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert kill.returncode == 0, kill.stdout + kill.stderr
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode != 0
    followed, _ = follow.communicate(timeout=60)  # --follow ends when the jobs end
    assert follow.returncode == 0, followed
    assert "node 0 attempt 0] working" in followed and "node 1 attempt 0] working" in followed, followed
    # SIGTERM unwinds the node: it says so and uploads its own logs before the engine's SIGKILL
    err = subprocess.run([sys.executable, "-m", "stoker.cli.main", "logs", f"Sleepy/{run_id}/work", "--stderr"],
                         env=env, capture_output=True, text=True, timeout=60).stdout
    # each node says it once (a traceback through the handler may also quote its source line: not counted)
    said = [ln for ln in err.splitlines() if "stoker: SIGTERM: stopping this node" in ln and 'print("' not in ln]
    assert len(said) == 2, err
    states = [json.loads(p.read_text()) for p in (Path(batch_env["BATCH_EMULATOR_DIR"]) / "jobs").glob("*.json")]
    assert [s["terminated"] for s in states] and all(s["terminated"].startswith("stoker: cancelled") for s in states), \
        seen + out
