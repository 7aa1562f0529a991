"""AWS Batch, emulated on this machine: the API is moto's (real requests, checked by botocore's model and by
moto), the containers are local processes.

moto's Batch runs no containers (its jobs go straight to SUCCEEDED) and ignores node overrides, and there is no
other Batch to run here. `EmulatedBatch` therefore stands in for the part of Batch that runs containers, and only
that part: every call also goes to moto's server, and on SubmitJob it starts one process per node with the
command of the job definition (Batch's `Ref::` parameters substituted) and exactly the environment Batch gives
that node (AWS_BATCH_JOB_ID `<id>#<node>`, AWS_BATCH_JOB_NODE_INDEX, AWS_BATCH_JOB_NUM_NODES,
AWS_BATCH_JOB_MAIN_NODE_INDEX, and AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS on every node but the main one),
the job definition's and the overrides' environment, its own empty HOME and working folder (a container shares no
disk with the submitter), plus this host's AWS settings as the job role's stand-in. Each node's output goes to
moto's CloudWatch Logs, to the stream the awslogs driver would use (`<definition>/default/<task id>`), and
DescribeJobs answers with each node's state as Batch would.

What Batch does with a multi-node job's nodes, and so the emulator (AWS Batch User Guide, "Job lifecycle for MNP
jobs" and "Multi-node parallel jobs"; backends/aws/node.py has the details):
- a child node that exits, fails or is lost changes nothing else: the other nodes run on, the job stays RUNNING,
  and the lost node is not replaced; its child job is FAILED with its exit code, or, for a lost instance, the
  status reason `Host EC2 (instance i-...) terminated.`;
- when the main node exits the job is over: every child still running is stopped (SIGTERM, then SIGKILL after
  the stop timeout), and the job's status, reason and exit code are the main node's.
`kill_node(job, node)` (from any process: the test's) kills one node's container, its whole process tree at once
with SIGKILL (torchrun's workers run in sessions of their own, so its process group is not enough), as a crashed
container (`how="container"`) or a lost instance (`how="instance"`).

Where it differs from Batch: the child nodes start with the main node, not once it runs; every node is on this one
machine (one host name; each node's address, like the main node's, is 127.0.0.1, and there is no ECS task metadata
endpoint, so a node finds its own address from the host name); a lost "instance" is a killed process tree whose
host folders survive; ECS's stop timeout is 5 s, not 30; Batch's own retries (`retryStrategy`) are not modelled
(stoker submits with 1 attempt).

`EmulatedBatchBackend` is the Batch backend with this client; a `run` in another process picks it up with
`STOKER_BACKENDS=batch=tests.batch_emulator:EmulatedBatchBackend`.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

import boto3
import psutil

from stoker.backends.aws.backend import BatchBackend
from stoker.backends.aws.client import BatchClient
from stoker.backends.aws.render import BatchOptions

HOST_ENV = ("PATH", "LANG", "AWS_ENDPOINT_URL", "STOKER_S3_ENDPOINT_URL", "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_REGION", "PYTHONPATH", "USER",
            "STOKER_LOG_UPLOAD_INTERVAL", "OMP_NUM_THREADS")  # not STOKER_STORE_KEY: the nodes read the store's
# signing key from the Secrets Manager secret the SubmitJob environment names (STOKER_STORE_KEY_SECRET), as on Batch
LOG_GROUP = "/aws/batch/job"
STOP_TIMEOUT_S = 5.0  # ECS's stop timeout (30 s on Batch), shortened
KILLED_REASONS = {"container": "Essential container in task exited",
                  "instance": "Host EC2 (instance {instance}) terminated."}


def _now_ms() -> int:
    return int(time.time() * 1000)


class _Node:
    def __init__(self, index: int, proc: subprocess.Popen | None, stream: str, container: str = "") -> None:
        self.index, self.proc, self.stream = index, proc, stream
        self.container = container  # its AWS_BATCH_JOB_ID: every process of the container has it (_container_procs)
        self.swept = False
        self.pid = proc.pid if proc else None
        self.started = _now_ms()
        self.stopped: int | None = None
        self.code: int | None = None
        self.reason: str | None = None
        self.lost = False  # its instance was lost (kill_node(how="instance")): no exit code, a host status reason

    def record(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("index", "pid", "stream", "started", "stopped", "code", "reason", "lost")}

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> _Node:
        node = cls(rec["index"], None, rec["stream"])
        for k in ("pid", "started", "stopped", "code", "reason"):
            setattr(node, k, rec[k])
        node.lost = bool(rec.get("lost"))
        return node


class EmulatedBatch:
    """A boto3 Batch client whose jobs run as local processes (see the module docstring)."""

    def __init__(self, batch: Any = None, logs: Any = None, workdir: str | None = None) -> None:
        self.batch = batch or boto3.client("batch")
        self.logs = logs or boto3.client("logs")
        self.workdir = workdir or tempfile.mkdtemp(prefix="batch-emulator-")
        self.jobs: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.submitted: list[dict[str, Any]] = []  # every SubmitJob request, as sent
        try:
            self.logs.create_log_group(logGroupName=LOG_GROUP)
        except self.logs.exceptions.ResourceAlreadyExistsException:
            pass

    def register_job_definition(self, **definition: Any) -> Any:
        """Registered with moto; kept here too, because moto's DescribeJobDefinitions leaves nodeProperties out
        of multi-node definitions registered with platformCapabilities (a file, so another process finds it)."""
        resp = self.batch.register_job_definition(**definition)
        with open(self._definition_file(resp["jobDefinitionArn"]), "w") as f:
            json.dump(definition, f)
        return resp

    def _file(self, kind: str, key: str) -> str:
        """Definitions and job states are kept as files, so that another process (`stoker logs`, `stoker kill`)
        sees what this one registered and ran, as it would on Batch."""
        return _state_file(kind, key)

    def _definition_file(self, arn: str) -> str:
        return self._file("definitions", arn)

    def _save(self, job: str) -> None:
        state = self.jobs[job]
        with self.lock:
            doc = {**{k: v for k, v in state.items() if k != "nodes"},
                   "nodes": [n.record() for n in state["nodes"].values()]}
        tmp = self._file("jobs", job) + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, self._file("jobs", job))

    def _state(self, job: str) -> dict[str, Any] | None:
        if job in self.jobs:
            return self.jobs[job]
        try:
            with open(self._file("jobs", job)) as f:
                doc = json.load(f)
        except OSError:
            return None
        return {**doc, "nodes": {n["index"]: _Node.from_record(n) for n in doc["nodes"]}}

    def _definition(self, ref: str) -> dict[str, Any]:
        jd = self.batch.describe_job_definitions(jobDefinitions=[ref])["jobDefinitions"][0]
        with open(self._definition_file(jd["jobDefinitionArn"])) as f:
            return {**json.load(f), "jobDefinitionArn": jd["jobDefinitionArn"]}

    def __getattr__(self, name: str) -> Any:
        """Every other call (RegisterJobDefinition, DescribeJobQueues ...) goes to moto as it is."""
        return getattr(self.batch, name)

    # -- calls that also run or stop the containers --------------------------------------------------
    def submit_job(self, **req: Any) -> Any:
        self.submitted.append(req)
        resp = self.batch.submit_job(**req)  # moto validates the request and gives the job its id
        jd = self._definition(req["jobDefinition"])
        job = resp["jobId"]
        multinode = jd["type"] == "multinode"
        n = (req.get("nodeOverrides") or {}).get("numNodes") or (jd["nodeProperties"]["numNodes"] if multinode else 1)
        container = (jd["nodeProperties"]["nodeRangeProperties"][0]["container"] if multinode
                     else jd["containerProperties"])
        overrides = ((((req.get("nodeOverrides") or {}).get("nodePropertyOverrides") or [{}])[0]
                      .get("containerOverrides") or {}) if multinode else req.get("containerOverrides") or {})
        params = {**jd.get("parameters", {}), **req.get("parameters", {})}
        command = [params.get(a[5:], a) if a.startswith("Ref::") else a for a in container["command"]]
        command = [sys.executable if i == 0 and a in ("python", "python3") else a for i, a in enumerate(command)]
        env_doc = {e["name"]: e["value"] for e in container.get("environment", []) + overrides.get("environment", [])}
        state = {"id": job, "name": req["jobName"], "definition": jd, "multinode": multinode, "n": n,
                 "created": _now_ms(), "nodes": {}, "terminated": None, "queue": req["jobQueue"]}
        with self.lock:
            self.jobs[job] = state
        faults = json.loads(os.environ.get("BATCH_EMULATOR_FAULTS") or "{}")
        for i in range(n):
            env = {k: os.environ[k] for k in HOST_ENV if k in os.environ}
            home = os.path.join(self.workdir, job, f"node{i}")
            os.makedirs(home, exist_ok=True)
            env.update(env_doc)
            env.update(self._container(container, multinode, i, home, faults.get(str(i)) or {}))
            env.update(HOME=home, STOKER_HOME=os.path.join(home, ".stoker"), AWS_BATCH_JOB_ATTEMPT="1",
                       AWS_BATCH_JQ_NAME=req["jobQueue"], AWS_BATCH_CE_NAME="emulated",
                       AWS_BATCH_JOB_ID=f"{job}#{i}" if multinode else job)
            if multinode:
                env.update(AWS_BATCH_JOB_NODE_INDEX=str(i), AWS_BATCH_JOB_NUM_NODES=str(n),
                           AWS_BATCH_JOB_MAIN_NODE_INDEX="0")
                if i != 0:
                    env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = "127.0.0.1"
            stream = f"{jd['jobDefinitionName']}/default/{uuid.uuid4().hex}"
            self.logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)
            proc = subprocess.Popen(command, env=env, cwd=home, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            node = _Node(i, proc, stream, container=env["AWS_BATCH_JOB_ID"])
            state["nodes"][i] = node
            threading.Thread(target=self._ship, args=(job, node), daemon=True).start()
        self._save(job)
        return resp

    def _container(self, container: dict[str, Any], multinode: bool, i: int, home: str,
                   fault: dict[str, Any]) -> dict[str, str]:
        """What a container of this job definition sees beyond its environment, as far as a process can be shown it
        (the variables below are the emulator's, read only by stoker's test hooks and the NxD stand-in):
        - devices: the job definition's `linuxParameters.devices` as files in the node's own dev folder
          (STOKER_DEV_DIR), with stand-ins of `neuron-ls` and `fi_info` on PATH that report what is mapped -- there
          is no Neuron or EFA hardware here, so these two tools are fakes;
        - host volumes: each `mountPoints` path is a folder of this emulated *instance* (kept across jobs, as a host
          folder is), given to stoker as STOKER_STAGE_DIR / NEURON_COMPILE_CACHE_URL;
        - network: a multi-node job runs in awsvpc mode, where the container has eth0 (its ENI) and ecs-eth0 (the
          ECS agent's bridge, 169.254.172.x): BATCH_EMULATOR_INTERFACES lists them.
        `fault` ({"missing_device": "/dev/neuron3"}, {"env": {...}}) breaks node i for failure tests."""
        env: dict[str, str] = {}
        devices = [d["containerPath"] for d in (container.get("linuxParameters") or {}).get("devices") or []]
        devices = [d for d in devices if d != fault.get("missing_device")]
        if devices:
            dev = os.path.join(home, "dev")
            for d in devices:
                path = os.path.join(dev, os.path.relpath(d, "/dev"))
                os.makedirs(os.path.dirname(path), exist_ok=True)
                open(path, "w").close()
            bin_dir = os.path.join(home, "bin")
            os.makedirs(bin_dir, exist_ok=True)
            neuron = sum(1 for d in devices if os.path.basename(d).startswith("neuron"))
            efa = sum(1 for d in devices if os.path.basename(d).startswith("uverbs"))
            _tool(bin_dir, "neuron-ls", json.dumps([{"neuron_device": k, "nc_count": 2} for k in range(neuron)]))
            _tool(bin_dir, "fi_info", "".join(f"provider: efa\n    fabric: efa\n    domain: rdmap{k}s0-rdm\n"
                                              for k in range(efa)), fails=efa == 0)
            env.update(STOKER_DEV_DIR=dev, PATH=bin_dir + os.pathsep + os.environ.get("PATH", os.defpath))
        instance = os.path.join(self.workdir, "instances", str(i))
        for mount in container.get("mountPoints") or []:
            path = mount["containerPath"]
            local = os.path.join(instance, path.strip("/").replace("/", "-"))
            os.makedirs(local, exist_ok=True)
            if path.endswith("stoker-stage"):
                env["STOKER_STAGE_DIR"] = local
            elif path.endswith("neuron-compile-cache"):
                env["NEURON_COMPILE_CACHE_URL"] = local
        if multinode:
            env["BATCH_EMULATOR_INTERFACES"] = "eth0,ecs-eth0"
        env.update(fault.get("env") or {})
        return env

    def _ship(self, job: str, node: _Node) -> None:
        """The awslogs driver: the node's output, line by line, into its CloudWatch stream."""
        lines: queue.Queue[bytes] = queue.Queue()
        assert node.proc is not None and node.proc.stdout is not None
        out = node.proc.stdout
        threading.Thread(target=lambda: [lines.put(raw) for raw in iter(out.readline, b"")] + [lines.put(b"")],
                         daemon=True).start()
        batch: list[dict[str, Any]] = []
        try:
            while True:
                try:
                    raw = lines.get(timeout=0.5)
                except queue.Empty:  # nothing new for a while: ship what is buffered
                    if node.proc.poll() is not None and not node.swept:
                        # the container's main process is gone, and with it the container: whatever it left running
                        # (holding its output open) ends too, as a PID namespace's processes do with its init
                        node.swept = True
                        _kill_container(node.container, node.pid)
                    self._put(node.stream, batch)
                    batch = []
                    continue
                if not raw:
                    break
                for line in raw.decode(errors="replace").rstrip("\n").split("\r"):
                    batch.append({"timestamp": _now_ms(), "message": line[:250_000] or " "})
                if len(batch) >= 200:
                    self._put(node.stream, batch)
                    batch = []
            self._put(node.stream, batch)
        except Exception as e:  # noqa: BLE001 - a driver that fails must not leave the job running forever
            print(f"batch emulator: shipping the log of {job}#{node.index} failed: {e!r}", file=sys.stderr)
        code = node.proc.wait()
        killed = _killed(job, node.index)  # kill_node() said why (it may run in another process)
        with self.lock:
            node.code, node.stopped = code, _now_ms()
            if killed:
                node.reason, node.lost = killed["reason"], killed["how"] == "instance"
        self._save(job)
        if node.index == 0:  # Batch: the job is over when the main node exits; a child's exit changes nothing
            self._end_others(job, "the main node exited")

    def _put(self, stream: str, events: list[dict[str, Any]]) -> None:
        if events:
            self.logs.put_log_events(logGroupName=LOG_GROUP, logStreamName=stream, logEvents=events)

    def _end_others(self, job: str, why: str) -> None:
        for node in self.jobs[job]["nodes"].values():
            if node.proc.poll() is None:
                node.reason = why
                _signal(node.proc, signal.SIGTERM)
        threading.Timer(STOP_TIMEOUT_S, self._kill_all, args=(job,)).start()

    def kill_node(self, job: str, index: int, how: str = "instance") -> list[int]:
        """Kill node `index` of a job this emulator runs (see the module function)."""
        return kill_node(job, index, how)

    def terminate_job(self, jobId: str, reason: str) -> Any:  # noqa: N803 - boto3's argument names
        resp = self.batch.terminate_job(jobId=jobId, reason=reason)
        state = self.jobs.get(jobId)
        if state is not None:
            state["terminated"] = reason
            self._save(jobId)
            for node in state["nodes"].values():
                if node.proc.poll() is None:
                    node.reason = f"Terminated: {reason}"
                    _signal(node.proc, signal.SIGTERM)
            threading.Timer(STOP_TIMEOUT_S, self._kill_all, args=(jobId,)).start()
        elif (other := self._state(jobId)) is not None:  # started by another process (`stoker kill`)
            other["terminated"] = reason
            self.jobs[jobId] = other
            self._save(jobId)
            del self.jobs[jobId]
            for node in other["nodes"].values():
                if node.code is None and node.pid:
                    try:
                        os.killpg(node.pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass
        return resp

    def _kill_all(self, job: str) -> None:
        """ECS's stop timeout is over: every process of the job's containers still running gets SIGKILL."""
        for node in self.jobs[job]["nodes"].values():
            if node.proc.poll() is None or not node.swept:
                node.swept = True
                _kill_container(node.container, node.pid)

    def describe_jobs(self, jobs: list[str]) -> dict[str, Any]:
        assert len(jobs) <= 100, "DescribeJobs takes at most 100 ids"
        out, others = [], []
        for jid in jobs:
            parent, _, node = jid.partition("#")
            state = self._state(parent)
            if state is None:
                others.append(jid)
            elif node:
                if state["multinode"] and int(node) in state["nodes"]:
                    out.append(self._node_desc(state, state["nodes"][int(node)]))
            else:
                out.append(self._job_desc(state))
        if others:
            out += self.batch.describe_jobs(jobs=others)["jobs"]
        return {"jobs": out}

    def _node_desc(self, state: dict[str, Any], node: _Node) -> dict[str, Any]:
        with self.lock:
            code, stopped, why, lost = node.code, node.stopped, node.reason, node.lost
        status = "RUNNING" if code is None else ("SUCCEEDED" if code == 0 and not lost else "FAILED")
        c: dict[str, Any] = {"logStreamName": node.stream, "networkInterfaces": [{"privateIpv4Address": "127.0.0.1"}]}
        d: dict[str, Any] = {"jobId": f"{state['id']}#{node.index}" if state["multinode"] else state["id"],
                             "jobName": state["name"], "status": status, "createdAt": state["created"],
                             "startedAt": node.started, "container": c}
        if code is not None:
            if not lost:  # a container whose host went away reports no exit code
                c["exitCode"] = code if code >= 0 else 128 - code
            d["stoppedAt"] = stopped
            if code or lost:
                d["statusReason"] = why or "Essential container in task exited"
        if state["multinode"]:
            d["nodeDetails"] = {"nodeIndex": node.index, "isMainNode": node.index == 0}
        return d

    def _job_desc(self, state: dict[str, Any]) -> dict[str, Any]:
        main = self._node_desc(state, state["nodes"][0])
        d = {**main, "jobId": state["id"], "jobQueue": state["queue"],
             "jobDefinition": state["definition"]["jobDefinitionArn"]}
        if state["terminated"] and main["status"] == "FAILED":
            d["statusReason"] = state["terminated"]
        if state["multinode"]:
            d.pop("nodeDetails", None)
            d["container"] = {}
            d["nodeProperties"] = {"numNodes": state["n"], "mainNode": 0}
        return d

    def pids(self) -> list[int]:
        return [n.proc.pid for s in self.jobs.values() for n in s["nodes"].values()]


def _state_file(kind: str, key: str) -> str:
    """The emulator's shared state ($BATCH_EMULATOR_DIR/<kind>/...): job states, definitions, kills."""
    folder = os.path.join(os.environ.get("BATCH_EMULATOR_DIR", os.path.join(tempfile.gettempdir(),
                                                                            "batch-emulator")), kind)
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")


def job_states() -> list[dict[str, Any]]:
    """Every job the emulator ran or runs (from any process), as saved: id, name, n, nodes [{index, pid, code ...}]."""
    folder = os.path.dirname(_state_file("jobs", "-"))
    out = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json"):
            try:
                with open(os.path.join(folder, name)) as f:
                    out.append(json.load(f))
            except (OSError, ValueError):  # being replaced right now
                continue
    return out


def kill_node(job: str, index: int, how: str = "instance") -> list[int]:
    """Kill node `index` of multi-node job `job` from any process, as Batch would lose it: its container's whole
    process tree gets SIGKILL at once (no SIGTERM: nothing of it runs on), then the emulator that runs the job
    reports the child job FAILED with `how`'s reason (`container`: the container died, exit code 137; `instance`:
    its host was terminated, no exit code). The other nodes are not told, as on Batch. Returns the killed pids."""
    if how not in KILLED_REASONS:
        raise ValueError(f"kill_node(how={how!r}): one of {sorted(KILLED_REASONS)}")
    with open(_state_file("jobs", job)) as f:
        state = json.load(f)
    node = next(n for n in state["nodes"] if n["index"] == index)
    if node["code"] is not None or not node["pid"]:
        raise RuntimeError(f"node {index} of job {job} is not running")
    instance = "i-emulated" + hashlib.sha256(f"{job}#{index}".encode()).hexdigest()[:12]
    reason = KILLED_REASONS[how].format(instance=instance)
    marker = _state_file("kills", f"{job}#{index}")
    with open(marker + ".tmp", "w") as f:
        json.dump({"how": how, "reason": reason, "at": time.time()}, f)
    os.replace(marker + ".tmp", marker)  # before the kill: the emulator reads it when it sees the node exit
    return _kill_container(f"{job}#{index}", node["pid"])


def _killed(job: str, index: int) -> dict[str, Any] | None:
    try:
        with open(_state_file("kills", f"{job}#{index}")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _container_procs(container: str, pid: int | None) -> list[psutil.Process]:
    """The processes of one node's "container": its main process, everything under it, and whatever of it was
    orphaned (torchrun's workers run in sessions of their own; a dead parent's children move to init), known by the
    AWS_BATCH_JOB_ID every process of the container inherits (the cgroup's stand-in)."""
    found: dict[int, psutil.Process] = {}
    if pid:
        try:
            root = psutil.Process(pid)
            if root.environ().get("AWS_BATCH_JOB_ID") == container:  # not a reused pid: the container's own
                for p in [root, *root.children(recursive=True)]:
                    found[p.pid] = p
        except (psutil.Error, OSError):
            pass
    if container:
        for p in psutil.process_iter():
            try:
                if p.pid not in found and p.environ().get("AWS_BATCH_JOB_ID") == container:
                    found[p.pid] = p
            except (psutil.Error, OSError):  # gone, a zombie, or not ours
                continue
    return list(found.values())


def _kill_container(container: str, pid: int | None) -> list[int]:
    """SIGKILL every process of a node's container (`_container_procs`), none given the time to notice: stopped
    first (so none forks or reaps meanwhile), listed again until the set holds still, then killed."""
    seen: dict[int, psutil.Process] = {}
    for _ in range(5):
        found = _container_procs(container, pid)
        new = [p for p in found if p.pid not in seen]
        for p in new:
            seen[p.pid] = p
            try:
                p.suspend()
            except psutil.NoSuchProcess:
                pass
        if not new:
            break
    for p in seen.values():
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    return sorted(seen)


def _tool(folder: str, name: str, output: str, fails: bool = False) -> None:
    """A stand-in executable that prints `output` (exit 1 when `fails`)."""
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\nexit {1 if fails else 0}\n")
    os.chmod(path, 0o755)


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


class EmulatedBatchBackend(BatchBackend):
    """The Batch backend, its jobs run by `EmulatedBatch`; queue and image are the test's (set in the env)."""

    def __init__(self, **kwargs: Any) -> None:
        options = BatchOptions(queue=os.environ.get("STOKER_BATCH_QUEUE", "stoker-test"),
                               image=os.environ.get("STOKER_BATCH_IMAGE", "stoker:test"), use_infra=False,
                               poll_interval=float(os.environ.get("STOKER_BATCH_POLL_INTERVAL", "0.5")))
        region = os.environ.get("AWS_REGION", "us-east-1")
        emulator = EmulatedBatch(boto3.client("batch", region_name=region), boto3.client("logs", region_name=region))
        super().__init__(options=options, client=BatchClient(region, batch=emulator, logs=emulator.logs), **kwargs)


def make_queue(name: str = "stoker-test", region: str = "us-east-1", max_vcpus: int = 1024, kind: str = "EC2") -> str:
    """A job queue (and its compute environment, network and roles) on moto's server; returns its name."""
    ec2, iam, batch = (boto3.client(s, region_name=region) for s in ("ec2", "iam", "batch"))
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/24")["Subnet"]["SubnetId"]
    sg = ec2.create_security_group(GroupName=f"{name}-sg", Description="test", VpcId=vpc)["GroupId"]
    role = iam.create_role(RoleName=f"{name}-service", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    profile = iam.create_instance_profile(InstanceProfileName=f"{name}-instance")["InstanceProfile"]["Arn"]
    ce = batch.create_compute_environment(
        computeEnvironmentName=f"{name}-ce", type="MANAGED", state="ENABLED", serviceRole=role,
        computeResources={"type": kind, "minvCpus": 0, "maxvCpus": max_vcpus, "instanceTypes": ["trn1.32xlarge"],
                          "subnets": [subnet], "securityGroupIds": [sg], "instanceRole": profile})
    batch.create_job_queue(jobQueueName=name, state="ENABLED", priority=1,
                           computeEnvironmentOrder=[{"order": 1, "computeEnvironment": ce["computeEnvironmentArn"]}])
    return name


def emulated_batch_env(aws: Any, tmp_path: Any) -> dict[str, str]:
    """The environment of a `run` (in another process) whose @batch steps go to the emulated Batch, with a queue
    and an S3 store (s3://stoker-bucket/stoker) on moto; `CWD` is a scratch folder to run it in."""
    from tests.helpers import ROOT

    aws.client("s3").create_bucket(Bucket="stoker-bucket")
    make_queue("stoker-test")
    # the store's signing key, where `stoker infra apply` puts it: the launching process signs with its own copy
    # ($STOKER_STORE_KEY), the nodes get only the secret's ARN
    secret = aws.client("secretsmanager").create_secret(Name="stoker/stoker-bucket/stoker/store-key",
                                                         SecretString=os.environ["STOKER_STORE_KEY"])["ARN"]
    env = {k: os.environ[k] for k in ("AWS_ENDPOINT_URL", "STOKER_S3_ENDPOINT_URL", "AWS_ACCESS_KEY_ID",
                                      "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_REGION")}
    env.update(STOKER_STORE="s3://stoker-bucket/stoker", STOKER_HOME=str(tmp_path / "home"), CWD=str(tmp_path),
               STOKER_BACKENDS="batch=tests.batch_emulator:EmulatedBatchBackend", STOKER_BATCH_QUEUE="stoker-test",
               STOKER_BATCH_POLL_INTERVAL="0.5", STOKER_LOG_UPLOAD_INTERVAL="1", STOKER_STORE_KEY_SECRET=secret,
               BATCH_EMULATOR_DIR=str(tmp_path / "emulator"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return env
