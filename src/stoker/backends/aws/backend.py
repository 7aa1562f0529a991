"""The AWS Batch backend: a task is a single-node job, a `num_parallel` gang one multi-node job (of N + k nodes
with `@torchrun(spares=k)`: the main node is kept as the last spare, `main_node_spare`; why in node.py).

Each node runs the task entrypoint from the code package and spec in the S3 store (render.py). One DescribeJobs
call (100 ids at most) polls every live job and the nodes of multi-node jobs; each node's output is read from
CloudWatch Logs (its own log stream) and streamed live, prefixed with the node. Ctrl-C, `stoker kill`, gang
fail-fast and @timeout call TerminateJob. `check()` refuses, before anything is submitted, what cannot work:
a store the nodes cannot reach, no image or queue, a request no instance type of the compute environment can
place (with the number that fits).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from stoker.backends.aws.client import BatchClient
from stoker.backends.aws.instances import INSTANCE_TYPES, fits, instance_type
from stoker.backends.aws.render import BatchOptions, render_requests, step_settings
from stoker.backends.aws.states import job_status, log_stream
from stoker.errors import ConfigError
from stoker.redact import SECRET_ENV_PREFIX
from stoker.runtime.contract import EXITED, QUEUED, Backend, Capabilities, JobRef, JobStatus, Request, Sink, Unit

log = logging.getLogger(__name__)


class _Tail:
    """CloudWatch read positions of one job's nodes, so `wait()` feeds each line to the sink once."""

    def __init__(self, ref: JobRef) -> None:
        self.ref = ref
        self.tokens: dict[int, str | None] = {}
        self.status: JobStatus | None = None
        self.done: set[int] = set()

    @property
    def over(self) -> bool:
        return len(self.done) >= self.ref.members


class BatchBackend(Backend):
    """Runs units as AWS Batch jobs (see the module docstring). Every argument is optional."""

    name = "batch"
    remote = True
    arrays = False
    persist_refs = True
    # Batch ends a multi-node job when its main node exits, and does nothing when a child node dies (node.py): a gang
    # with spares runs generation 0 on nodes 1..N and keeps the main node as its last spare
    main_node_spare = True

    def __init__(self, options: BatchOptions | None = None, client: BatchClient | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.options = options or BatchOptions()
        self.client = client or BatchClient(self.options.region)
        self._injected = client is not None
        self._regional: dict[str, BatchClient] = {}  # jobs of another region (`stoker kill` from elsewhere)
        self.poll_interval = self.options.poll_interval
        self.sleep = sleep
        self._streams: dict[tuple[str, int], str] = {}  # (job, member) -> CloudWatch log stream
        self._tails: dict[str, _Tail] = {}
        self._last_logs = 0.0
        self._warned: set[tuple[str, str]] = set()
        self._sink: Sink | None = None  # wait()'s, kept to flush a node's last lines when poll() sees it end

    # -- before submitting ----------------------------------------------------------------------------
    def capabilities(self) -> Capabilities:
        types = [t for t in (instance_type(n) for n in self.options.instance_types) if t]
        return Capabilities(multi_node=True, gpus=max((t.gpus for t in types), default=0),
                            trainium=max((t.neuron_devices for t in types if t.trainium), default=0),
                            efa=any(t.efa_interfaces for t in types), cpus=max((t.vcpus for t in types), default=0),
                            memory_mb=max((t.ecs_memory_mib for t in types), default=0),
                            notes=[f"instance types: {', '.join(self.options.instance_types) or 'unknown'}"])

    def check(self, unit: Unit) -> None:
        where = f"step {unit.step!r} (@batch)"
        store = unit.store_url or _default_store()
        if not store.startswith("s3://"):
            raise ConfigError(f"{where}: the store {store} is a folder on this machine, which Batch containers "
                              f"cannot reach: use an S3 store, e.g. export STOKER_STORE=s3://BUCKET/stoker "
                              f"(`stoker infra apply` creates the bucket and prints the URL)")
        s = step_settings(unit, self.options)
        if not s["image"]:
            raise ConfigError(f"{where}: no container image: set @batch(image=...) or STOKER_BATCH_IMAGE, or run "
                              f"`stoker infra apply` and `stoker image build FLOW --push` (it records the pushed "
                              f"digest as the infra's image)")
        if "@sha256:" not in s["image"] and unit.kind == "gang" and (unit.step, s["image"]) not in self._warned:
            self._warned.add((unit.step, s["image"]))  # once per step, not at every check of its gangs
            log.warning("%s: image %s is a tag, which a push can move while the gang's nodes pull it one by one "
                        "(then they run different images): name a digest, REPOSITORY@sha256:... (`stoker image "
                        "build --push` prints it)", where, s["image"])
        if not s["queue"]:
            raise ConfigError(f"{where}: no job queue: set @batch(queue=...) or STOKER_BATCH_QUEUE, or run "
                              f"`stoker infra apply` (it creates one)")
        if not self.options.store_key_secret:
            raise ConfigError(f"{where}: the Batch nodes need the store's signing key, and no Secrets Manager secret "
                              f"holds it for them: run `stoker infra apply` (it creates one and lets the job role "
                              f"read it), or set STOKER_STORE_KEY_SECRET to the ARN of a secret holding the key that "
                              f"the job role may read (see docs/aws.md, 'The store key')")
        secret = sorted(k[len(SECRET_ENV_PREFIX):].lower() for k in os.environ if k.startswith(SECRET_ENV_PREFIX))
        if secret:  # the value lives only in this process's environment; a Batch container never gets it
            raise ConfigError(f"{where}: the run has secret parameters ({', '.join(secret)}), whose values are never "
                              f"stored and so cannot reach Batch containers: keep the secret in AWS Secrets Manager "
                              f"and read it in the step with the job role (boto3 get_secret_value), or run the step "
                              f"locally or on Slurm (docs/store.md, 'Security')")
        self._check_fit(unit, s, where)
        q = self.client.queue(s["queue"])
        if q is None:
            raise ConfigError(f"{where}: the job queue {s['queue']!r} does not exist in "
                              f"{self.client.region or 'the default region'}: run `stoker infra apply`, or set "
                              f"@batch(queue=...) / STOKER_BATCH_QUEUE to an existing queue")
        if q.get("state") != "ENABLED" or q.get("status") not in (None, "VALID", "UPDATING", "CREATING"):
            raise ConfigError(f"{where}: the job queue {s['queue']!r} is {q.get('state')}/{q.get('status')} "
                              f"({q.get('statusReason') or 'no reason given'}), so no job would start: enable it "
                              f"(`stoker infra apply`) or pick another queue")
        if unit.kind == "gang":
            self._check_gang_capacity(unit, s, q, where)

    def _check_gang_capacity(self, unit: Unit, s: dict[str, Any], queue: dict[str, Any], where: str) -> None:
        """A multi-node job needs EC2 (not Spot or Fargate) and room for all its nodes at once."""
        envs = self.client.compute_environments(queue)
        usable = [e for e in envs if (e.get("computeResources") or {}).get("type") in ("EC2", None)
                  and e.get("state") != "DISABLED"]
        name = queue.get("jobQueueName", s["queue"])
        gang = f"a gang of {unit.size} nodes" + (f" and {unit.spares} spare{'s' if unit.spares > 1 else ''}"
                                                  if unit.spares else "")
        if envs and not usable:
            kinds = ", ".join(sorted({str((e.get("computeResources") or {}).get("type")) for e in envs}))
            raise ConfigError(f"{where}: {gang} is a multi-node job, which Batch runs only on "
                              f"on-demand EC2 compute environments, but queue {name!r} has {kinds}: use a queue of "
                              f"an EC2 compute environment (`stoker infra apply` with spot = false)")
        itype = instance_type(s["instance_type"]) if s["instance_type"] else None
        per_node = itype.vcpus if itype else s["cpu"]
        need = unit.nodes * per_node  # every node of the job at once, spares included
        room = max(((e.get("computeResources") or {}).get("maxvCpus") or 0 for e in usable), default=0)
        if usable and room and need > room:
            raise ConfigError(f"{where}: {gang} needs {need} vCPUs at once ({per_node} a node"
                              f"{' on ' + itype.name if itype else ''}), but the compute environments of queue "
                              f"{name!r} allow at most {room}; the job would wait forever. Fix: raise max_vcpus in "
                              f"stoker-infra.toml to {need} or more and run `stoker infra apply`, or lower "
                              f"num_parallel" + (" or spares" if unit.spares else ""))

    def _check_fit(self, unit: Unit, s: dict[str, Any], where: str) -> None:
        """The request must fit one node of an instance type the compute environment can launch."""
        names = [s["instance_type"]] if s["instance_type"] else list(self.options.instance_types)
        known = [t for t in (instance_type(n) for n in names) if t]
        if s["instance_type"] and not known:
            log.warning("%s: instance type %s is not in stoker's table; the request is not checked", where, names[0])
            return
        pool = known or list(INSTANCE_TYPES.values())
        ask = {"cpu": s["cpu"], "memory_mib": s["memory"], "gpu": s["gpu"], "trainium": s["trainium"],
               "inferentia": s["inferentia"], "efa": s["efa"]}
        reasons = {t.name: fits(t, **ask) for t in pool}
        if any(r is None for r in reasons.values()):
            return
        if known:
            detail = "; ".join(reasons.values())
            mem = [t for t in known if reasons[t.name] and reasons[t.name].startswith("memory=")]
            hint = (f" Fix: ask for at most memory={max(t.ecs_memory_mib for t in mem)} (MiB, what the instance "
                    f"registers with ECS; the rest is the kernel's and the ECS agent's)") if mem else (
                    " Fix: lower the request or add a larger instance type to the compute environment")
            raise ConfigError(f"{where}: the request cannot be placed on {', '.join(names)}: {detail}. Batch "
                              f"would leave the job RUNNABLE forever.{hint}")
        raise ConfigError(f"{where}: no instance type stoker knows can take cpu={s['cpu']}, memory={s['memory']} "
                          f"MiB, gpu={s['gpu']}, trainium={s['trainium']}, efa={s['efa']} on one node; lower the "
                          f"request (per node) or set @batch(instance_type=...) for a type stoker does not list")

    # -- the contract ---------------------------------------------------------------------------------
    def materialize(self, unit: Unit) -> Request:
        definition, submit, text = render_requests(unit, self.options)
        return Request(backend=self.name, unit=unit, text=text,
                       payload={"definition": definition, "submit": submit})

    def submit(self, request: Request) -> JobRef:
        unit = request.unit
        arn = self.client.ensure_definition(request.payload["definition"])
        job = self.client.submit({**request.payload["submit"], "jobDefinition": arn})
        s = step_settings(unit, self.options)
        itype = s["instance_type"] or (self.options.instance_types[0] if len(self.options.instance_types) == 1
                                       else None)
        ref = JobRef(backend=self.name, job_id=job, members=unit.nodes, kind=unit.kind, step=unit.step,
                     task_ids=[sp.task_id for sp in unit.specs], attempt=unit.attempt,
                     extra={"region": self.client.region_name(), "log_group": self.options.log_group,
                            "queue": request.payload["submit"]["jobQueue"], "instance_type": itype})
        self._tails[job] = _Tail(ref)
        log.debug("submitted %s as Batch job %s", unit.label, job)
        return ref

    def poll(self, refs: list[JobRef]) -> dict[str, JobStatus]:
        if not refs:
            return {}
        by_client: dict[int, tuple[BatchClient, list[str]]] = {}
        for r in refs:
            client = self._for(r)
            ids = by_client.setdefault(id(client), (client, []))[1]
            ids.append(r.job_id)
            if r.kind == "gang":
                ids += [f"{r.job_id}#{i}" for i in range(r.members)]
        found: dict[str, dict[str, Any]] = {}
        for client, ids in by_client.values():
            found.update(client.describe(ids))
        out: dict[str, JobStatus] = {}
        for r in refs:
            parent = found.get(r.job_id)
            if parent is None:
                continue
            nodes = {i: found[f"{r.job_id}#{i}"] for i in range(r.members) if f"{r.job_id}#{i}" in found}
            st = job_status(parent, nodes)
            out[r.job_id] = st
            for key, field in (("started_at", "startedAt"), ("stopped_at", "stoppedAt")):
                if isinstance(parent.get(field), (int, float)) and parent[field]:
                    r.extra[key] = parent[field] / 1000.0  # node-hours for the cost (the record is re-saved)
            self._remember_streams(r, parent, nodes)
            tail = self._tails.setdefault(r.job_id, _Tail(r))  # re-attached refs are tailed too
            tail.status = st
            ended = [i for i in range(r.members) if st.member(i).state == EXITED and i not in tail.done]
            if ended and self._sink is not None:
                try:  # a node's last lines, before the scheduler hears that it ended (then it stops listening)
                    self._feed(tail, self._sink)
                except Exception as e:  # noqa: BLE001 - live output is best effort; the store has the logs
                    log.debug("CloudWatch tail of %s: %s", r.job_id, e)
        return out

    def _remember_streams(self, ref: JobRef, parent: dict[str, Any], nodes: dict[int, dict[str, Any]]) -> None:
        for i, desc in nodes.items():
            if s := log_stream(desc):
                self._streams[(ref.job_id, i)] = s
        if (ref.job_id, 0) not in self._streams and (s := log_stream(parent)):
            self._streams[(ref.job_id, 0)] = s  # a single-node job's own stream

    def _for(self, ref: JobRef) -> BatchClient:
        """The client of the job's region (a job record names it; `stoker kill` may run with another default)."""
        region = ref.extra.get("region")
        if self._injected or not region or region == self.client.region_name():
            return self.client
        if region not in self._regional:
            self._regional[region] = BatchClient(region)
        return self._regional[region]

    def cancel(self, ref: JobRef, grace: float = 3.0, member: int | None = None) -> None:
        """TerminateJob: Batch stops every node (SIGTERM, then SIGKILL after ECS's stop timeout, 30 s by
        default); `grace` cannot shorten or lengthen that."""
        self._for(ref).terminate(ref.job_id, reason="stoker: cancelled (Ctrl-C, stoker kill, a failed gang node "
                                                 "or @timeout)")

    def _stream(self, ref: JobRef, member: int) -> str | None:
        if (ref.job_id, member) not in self._streams:
            ids = [ref.job_id] + ([f"{ref.job_id}#{member}"] if ref.kind == "gang" else [])
            found = self._for(ref).describe(ids)
            if ref.job_id in found:
                node = found.get(f"{ref.job_id}#{member}")
                self._remember_streams(ref, found[ref.job_id], {member: node} if node else {})
        return self._streams.get((ref.job_id, member))

    def logs(self, ref: JobRef, member: int = 0, stream: str = "stdout") -> bytes:
        """The node's CloudWatch log (Batch's awslogs driver merges stdout and stderr: all of it is "stdout")."""
        if stream != "stdout":
            return b""
        name = self._stream(ref, member)
        if not name:
            return b""
        lines, _ = self._for(ref).log_events(ref.extra.get("log_group") or self.options.log_group, name)
        return "".join(line + "\n" for line in lines).encode()

    def wait(self, timeout: float, sink: Sink) -> None:
        """Feed new CloudWatch lines of every started node to `sink` (at most once per poll interval), then
        sleep out `timeout`."""
        deadline = time.monotonic() + timeout
        self._sink = sink
        if time.monotonic() - self._last_logs >= self.poll_interval:
            self._last_logs = time.monotonic()
            for job, tail in list(self._tails.items()):
                try:
                    self._feed(tail, sink)
                except Exception as e:  # noqa: BLE001 - live output is best effort; the store has the logs
                    log.debug("CloudWatch tail of %s: %s", job, e)
                if tail.over:
                    del self._tails[job]
        left = deadline - time.monotonic()
        if left > 0:
            self.sleep(left)

    def _feed(self, tail: _Tail, sink: Sink) -> None:
        if tail.status is None:
            return
        group = tail.ref.extra.get("log_group") or self.options.log_group
        for member in range(tail.ref.members):
            state = tail.status.member(member).state
            name = self._streams.get((tail.ref.job_id, member))
            if member in tail.done or state == QUEUED or not name:
                if state == EXITED and not name:
                    tail.done.add(member)  # it never logged (e.g. the image could not be pulled)
                continue
            lines, tail.tokens[member] = self._for(tail.ref).log_events(group, name, tail.tokens.get(member))
            if lines:
                sink(tail.ref, member, "stdout", "".join(line + "\n" for line in lines).encode())
            if state == EXITED:
                tail.done.add(member)

    def close(self) -> None:
        self._tails.clear()


def _default_store() -> str:
    from stoker.store.paths import default_store_url

    return default_store_url()
