"""Batch requests for units: pure functions of (unit, options), so `--dry-run` and golden files show exactly
what is registered and submitted.

A "task" is a single-node job (`type: container`); a "gang" of N is one multi-node job (`type: multinode`,
`mainNode 0`, one node range `0:` for every node, `nodeOverrides.numNodes = N`); a gang with k hot spares
(`@torchrun(spares=k)`) is one job of N + k nodes (`unit.nodes`), the same in every other respect (node.py says
which node waits as a spare). The job definition depends
only on the step (image, resources, devices, roles), so it is registered once and reused by every run: its name
carries a hash of its content. What differs per submission travels in the SubmitJob request: the blob keys as
Batch *parameters* (`Ref::code` in the command) and non-secret environment values. Secrets never appear in
either: the containers get AWS credentials from the job role, and the store's signing key from the Secrets
Manager secret named in $STOKER_STORE_KEY_SECRET (its ARN, never the key).

Devices: `trainium`/`inferentia` N maps /dev/neuron0..N-1, `efa` N maps /dev/infiniband/uverbs0..N-1; both
set memlock unlimited (the Neuron runtime and libfabric pin memory).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from stoker.backends.aws.decorator import node_resources
from stoker.runtime.contract import Unit

TIMEOUT_MARGIN_S = 300  # the scheduler enforces @timeout; Batch's attempt timeout is the backstop behind it
GANG_RDZV_TIMEOUT_S = 3600  # how long the nodes of a multi-node job wait for each other
# non-secret settings the nodes need too (the run's own switches, STOKER_SMOKE / STOKER_PREFLIGHT*, come in
# unit.env: runtime.jobs.RUN_ENV)
ENV_PASSED = ("STOKER_S3_ENDPOINT_URL", "STOKER_LOG_UPLOAD_INTERVAL")
NOFILE = 1048576
# host folders mounted into gang and Neuron containers: staged inputs (distributed/stage.py) and the Neuron compile
# cache (distributed/accel.py); both are keyed by content, so a later job on the instance may reuse them
NODE_CACHES = ("/var/tmp/stoker-stage", "/var/tmp/neuron-compile-cache")
# Multi-node jobs run in awsvpc mode, where a container sees eth0 (the job's ENI, the one the nodes reach each
# other on) and ecs-eth0 (169.254.172.x, the ECS agent's bridge). The Neuron collectives pick an interface
# unless told; on ecs-eth0 the nodes never meet. AWS's Neuron container recipes all set this.
NEURON_BATCH_ENV = {"CCOM_SOCKET_IFNAME": "eth0"}


def _infra_outputs() -> dict[str, Any]:
    try:
        from stoker.backends.aws.infra.state import load_outputs
    except ImportError:
        return {}
    try:
        return load_outputs() or {}
    except Exception:  # noqa: BLE001 - a broken state file must not break a dry run; `stoker infra status` says why
        return {}


@dataclass(kw_only=True)
class BatchOptions:
    """How the Batch backend submits (per backend instance; per-step settings come from @batch).

    Every default comes from the environment, else from `stoker infra apply`'s outputs:
    queue ($STOKER_BATCH_QUEUE), image ($STOKER_BATCH_IMAGE; infra's: the digest `stoker image build --push`
    recorded), job_role ($STOKER_BATCH_JOB_ROLE, the role the containers run as), execution_role
    ($STOKER_BATCH_EXECUTION_ROLE), region ($STOKER_AWS_REGION / $AWS_REGION),
    instance_types (what the compute environment launches: requests are checked against them),
    log_group (where Batch's awslogs driver writes, `/aws/batch/job`), python (the image's interpreter),
    poll_interval ($STOKER_BATCH_POLL_INTERVAL, default 5 s: one DescribeJobs call per interval for all jobs),
    store_key_secret ($STOKER_STORE_KEY_SECRET: the Secrets Manager secret, ARN or name, holding the store's
    signing key; the nodes read the key from it).
    """

    queue: str | None = None
    image: str | None = None
    job_role: str | None = None
    execution_role: str | None = None
    region: str | None = None
    instance_types: list[str] = field(default_factory=list)
    log_group: str = "/aws/batch/job"
    python: str = field(default_factory=lambda: os.environ.get("STOKER_BATCH_PYTHON", "python"))
    poll_interval: float = field(default_factory=lambda: float(os.environ.get("STOKER_BATCH_POLL_INTERVAL", "5")))
    store_key_secret: str | None = None
    use_infra: bool = True  # fill what is not given from `stoker infra`'s state

    def __post_init__(self) -> None:
        env = os.environ
        out = _infra_outputs() if self.use_infra else {}
        self.queue = self.queue or env.get("STOKER_BATCH_QUEUE") or out.get("queue")
        self.image = self.image or env.get("STOKER_BATCH_IMAGE") or out.get("image")
        self.job_role = self.job_role or env.get("STOKER_BATCH_JOB_ROLE") or out.get("job_role_arn")
        self.execution_role = (self.execution_role or env.get("STOKER_BATCH_EXECUTION_ROLE")
                               or out.get("execution_role_arn"))
        self.region = self.region or env.get("STOKER_AWS_REGION") or out.get("region")
        self.instance_types = list(self.instance_types or out.get("instance_types") or [])
        self.store_key_secret = (self.store_key_secret or env.get("STOKER_STORE_KEY_SECRET")
                                 or out.get("store_key_secret_arn"))
        if self.poll_interval <= 0:
            from stoker.errors import ConfigError

            raise ConfigError(f"BatchOptions(poll_interval={self.poll_interval}): must be more than 0 seconds "
                              f"(STOKER_BATCH_POLL_INTERVAL)")


def _name(text: str, limit: int = 128) -> str:
    """Batch names: letters, digits, '-' and '_' (up to 128)."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", text)[:limit]


def whole_node(res: dict[str, int], names: list[str]) -> dict[str, int] | None:
    """The vCPUs and ECS memory every instance type that can take these devices has (the given types, else
    every type stoker knows): what an accelerator step gets when it does not say, instead of Batch's 1 vCPU
    and 4096 MiB, which would starve a node of 16 Trainium devices."""
    from stoker.backends.aws.instances import INSTANCE_TYPES, fits, instance_type

    pool = [t for t in (instance_type(n) for n in names) if t] or list(INSTANCE_TYPES.values())
    ok = [t for t in pool if fits(t, gpu=res["gpu"], trainium=res["trainium"], inferentia=res["inferentia"],
                                  efa=res["efa"]) is None]
    if not ok:
        return None
    return {"cpu": min(t.vcpus for t in ok), "memory": min(t.ecs_memory_mib for t in ok)}


def step_settings(unit: Unit, opts: BatchOptions) -> dict[str, Any]:
    """@batch merged with @resources and the backend's defaults: what the job definition is made of."""
    o = unit.options
    res = node_resources(o, unit.resources)
    itype = o.get("instance_type") or (opts.instance_types[0] if len(opts.instance_types) == 1 else None)
    if res["trainium"] or res["inferentia"] or res["gpu"]:  # an accelerator node: all of it, unless told
        whole = whole_node(res, [itype] if itype else opts.instance_types)
        for key in ("cpu", "memory"):
            if whole and o.get(key) is None and unit.resources.get(key) is None:
                res[key] = whole[key]
    return {
        **res,
        "image": o.get("image") or opts.image,
        "queue": o.get("queue") or opts.queue,
        "job_role": o.get("iam_role") or opts.job_role,
        "execution_role": o.get("execution_role") or opts.execution_role,
        "instance_type": o.get("instance_type"),
    }


def _container(unit: Unit, opts: BatchOptions, s: dict[str, Any]) -> dict[str, Any]:
    o = unit.options
    reqs = [{"type": "VCPU", "value": str(s["cpu"])}, {"type": "MEMORY", "value": str(s["memory"])}]
    if s["gpu"]:
        reqs.append({"type": "GPU", "value": str(s["gpu"])})
    c: dict[str, Any] = {
        "image": s["image"] or ("<image: set @batch(image=...), STOKER_BATCH_IMAGE or run `stoker image build "
                                "--push`>"),
        "command": [opts.python, "-m", "stoker.backends.aws.node", "--store", "Ref::store", "--code", "Ref::code",
                    "--spec", "Ref::spec"],
        "resourceRequirements": reqs,
    }
    if s["job_role"]:
        c["jobRoleArn"] = s["job_role"]
    if s["execution_role"]:
        c["executionRoleArn"] = s["execution_role"]
    # an init process as PID 1: it forwards SIGTERM (TerminateJob, @timeout) so the node can stop torchrun
    # and upload its logs and compile cache; a plain PID 1 ignores SIGTERM until ECS's SIGKILL
    linux: dict[str, Any] = {"initProcessEnabled": True}
    neuron = s["trainium"] or s["inferentia"]
    devices = [f"/dev/neuron{i}" for i in range(neuron)] + [f"/dev/infiniband/uverbs{i}" for i in range(s["efa"])]
    if devices:
        linux["devices"] = [{"hostPath": d, "containerPath": d, "permissions": ["READ", "WRITE", "MKNOD"]}
                            for d in devices]
    if s["shared_memory"]:
        linux["sharedMemorySize"] = s["shared_memory"]
    if o.get("use_tmpfs"):
        size = o.get("tmpfs_size") or max(1, s["memory"] // 2)
        linux["tmpfs"] = [{"containerPath": o.get("tmpfs_path") or "/stoker_temp", "size": size,
                           "mountOptions": ["rw", "noexec"]}]
    if o.get("max_swap") is not None:
        linux["maxSwap"] = o["max_swap"]
        linux["swappiness"] = 60 if o.get("swappiness") is None else o["swappiness"]
    c["linuxParameters"] = linux
    if neuron or s["efa"] or unit.kind == "gang":
        # memlock: the Neuron runtime and libfabric pin memory; nofile: collectives open many files per rank
        # (every AWS training recipe raises `ulimit -n`; Docker's default soft limit is 1024)
        c["ulimits"] = [{"name": "memlock", "softLimit": -1, "hardLimit": -1},
                        {"name": "nofile", "softLimit": NOFILE, "hardLimit": NOFILE}]
    vols = list(o.get("host_volumes") or [])
    if neuron or unit.kind == "gang":  # node caches that outlive a container: a retry on the same instance
        vols += [v for v in NODE_CACHES if v not in vols]  # reuses staged data and compiled graphs
    if vols:
        names = [_name(f"host{v}", 255) for v in vols]
        c["volumes"] = [{"name": n, "host": {"sourcePath": v}} for n, v in zip(names, vols, strict=True)]
        c["mountPoints"] = [{"sourceVolume": n, "containerPath": v, "readOnly": False}
                            for n, v in zip(names, vols, strict=True)]
    if o.get("privileged"):
        c["privileged"] = True
    if o.get("log_driver"):
        c["logConfiguration"] = {"logDriver": o["log_driver"], "options": dict(o.get("log_options") or {})}
    return c


def job_definition(unit: Unit, opts: BatchOptions) -> dict[str, Any]:
    """RegisterJobDefinition parameters for the unit's step; the name ends with a hash of the content."""
    s = step_settings(unit, opts)
    container = _container(unit, opts, s)
    body: dict[str, Any] = {"retryStrategy": {"attempts": 1},  # stoker retries (and resumes) itself
                            "propagateTags": True, "platformCapabilities": ["EC2"]}
    if unit.kind == "gang":
        body.update(type="multinode", nodeProperties={
            "numNodes": unit.nodes, "mainNode": 0,
            "nodeRangeProperties": [{"targetNodes": "0:", "container": container}]})
    else:
        body.update(type="container", containerProperties=container)
    tags = {"stoker:managed": "true", "stoker:flow": unit.flow, "stoker:step": unit.step}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]
    name = _name(f"stoker-{unit.flow}-{unit.step}")[:110] + f"-{digest}"
    return {"jobDefinitionName": name, **body, "tags": tags}


def submit_request(unit: Unit, opts: BatchOptions, definition: str) -> dict[str, Any]:
    """SubmitJob parameters for one unit (the blob keys as parameters, the environment as overrides)."""
    s = step_settings(unit, opts)
    first = unit.specs[0]
    env = {k: os.environ[k] for k in ENV_PASSED if os.environ.get(k)}
    region = opts.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:  # the nodes' S3 and CloudWatch clients need it; the container has no profile
        env.update(AWS_REGION=region, AWS_DEFAULT_REGION=region)
    if unit.kind == "gang":  # Batch starts the other nodes after the main one runs, each pulling the image
        env["STOKER_RDZV_TIMEOUT"] = os.environ.get("STOKER_RDZV_TIMEOUT", str(GANG_RDZV_TIMEOUT_S))
    if s["trainium"] or s["inferentia"]:
        env.update(NEURON_BATCH_ENV)  # @environment(vars=...) in the step still wins (it is applied later)
    env.update(unit.env)
    if opts.store_key_secret:  # where the nodes read the store's signing key; the key itself never travels
        env["STOKER_STORE_KEY_SECRET"] = opts.store_key_secret
    env.pop("STOKER_STORE_KEY", None)
    overrides = {"environment": [{"name": k, "value": str(v)} for k, v in sorted(env.items())]}
    req: dict[str, Any] = {
        "jobName": _name(f"{unit.flow}-{unit.run_id}-{unit.step}-{first.task_id}-a{unit.attempt}"),
        "jobQueue": s["queue"] or "<queue: set @batch(queue=...), STOKER_BATCH_QUEUE or run `stoker infra apply`>",
        "jobDefinition": definition,
        "parameters": {"store": unit.store_url, "code": unit.code_key or "-", "spec": unit.spec_key or "-"},
        "tags": {**(unit.options.get("aws_batch_tags") or {}), "stoker:flow": unit.flow, "stoker:run": unit.run_id,
                 "stoker:step": unit.step, "stoker:task": first.task_id, "stoker:attempt": str(unit.attempt)},
        "propagateTags": True,
    }
    if unit.kind == "gang":
        req["nodeOverrides"] = {"numNodes": unit.nodes, "nodePropertyOverrides": [
            {"targetNodes": "0:", "containerOverrides": overrides}]}
    else:
        req["containerOverrides"] = overrides
    if unit.timeout_s:
        req["timeout"] = {"attemptDurationSeconds": int(unit.timeout_s) + TIMEOUT_MARGIN_S}
    return req


def render_requests(unit: Unit, opts: BatchOptions) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(job definition, submit request, the text --dry-run prints)."""
    jd = job_definition(unit, opts)
    sub = submit_request(unit, opts, jd["jobDefinitionName"])
    text = json.dumps({"RegisterJobDefinition": jd, "SubmitJob": sub}, indent=2, sort_keys=True) + "\n"
    return jd, sub, text
