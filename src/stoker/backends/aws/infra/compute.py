"""Batch: the managed EC2 compute environment and the job queue, with the waits AWS needs (a compute
environment must be disabled and settled before it can be deleted, a queue before its environment)."""

from __future__ import annotations

from typing import Any

from stoker.backends.aws.infra.base import Actual, Resource, tag_dict
from stoker.backends.aws.infra.spec import PENDING, compute_environment_request, compute_resources, job_queue_request
from stoker.errors import BackendError

UNORDERED = ("instanceTypes", "subnets", "securityGroupIds")
LIVE_STATUSES = ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING")  # not ended: SUCCEEDED, FAILED
TERMINATE_REASON = "stoker infra destroy --terminate-jobs: the job queue is deleted"
IAM_PROPAGATION = ("ClientException", "InvalidParameterValueException")


class BatchResource(Resource):
    """What the compute environment and the job queue share: describe by name, wait for a settled status."""

    describe_op = ""
    list_key = ""
    name_field = ""
    arn_field = ""
    param = ""

    def _describe(self) -> dict[str, Any] | None:
        got = self.ctx.call("batch", self.describe_op, self.label, **{self.param + "s": [self.name]})
        for item in got.get(self.list_key, []):
            if item.get(self.name_field) == self.name and item.get("status") != "DELETED":
                return item
        return None

    def read(self) -> Actual | None:
        item = self._describe()
        if item is None:
            return None
        return Actual(id=self.name, arn=item[self.arn_field], tags=tag_dict(item.get("tags")), data=item)

    def settled(self, state: str | None = None, invalid_ok: bool = False) -> bool:
        item = self._describe()
        if item is None:
            return True
        if item.get("status") == "INVALID" and not invalid_ok:
            raise BackendError(f"{self.label} is INVALID: {item.get('statusReason')}. Fix the cause it names "
                               "(often a role, subnet or launch template) and run `stoker infra apply` again")
        return item.get("status") in (("VALID", "INVALID") if invalid_ok else ("VALID",)) and (
            state is None or item.get("state") == state)

    def wait_settled(self, state: str | None = None, invalid_ok: bool = False) -> None:
        self.ctx.wait(f"{self.label} to be VALID" + (f" and {state}" if state else ""),
                      lambda: self.settled(state, invalid_ok),
                      "look at its status reason in the Batch console, then rerun the command")

    def wait_gone(self) -> None:
        self.ctx.wait(f"{self.label} to be deleted", lambda: self._describe() is None,
                      "look at its status in the Batch console, then rerun `stoker infra destroy`")

    def disable_and_delete(self, actual: Actual) -> None:
        op = "update_compute_environment" if self.key == "compute_environment" else "update_job_queue"
        delete = "delete_compute_environment" if self.key == "compute_environment" else "delete_job_queue"
        if actual.data.get("state") != "DISABLED":
            self.ctx.report(f"  disabling {self.label}")
            self.ctx.call("batch", op, self.label, **{self.param: self.name, "state": "DISABLED"})
        self.wait_settled("DISABLED", invalid_ok=True)  # an INVALID one can still be deleted
        self.ctx.call("batch", delete, self.label, **{self.param: self.name})
        self.wait_gone()

    def describe(self, actual: Actual) -> str:
        d = actual.data
        reason = f" ({d.get('statusReason')})" if d.get("status") not in ("VALID", None) else ""
        return f"{d.get('state')}, {d.get('status')}{reason}"


class ComputeEnvironment(BatchResource):
    key = "compute_environment"
    kind = "compute environment"
    describe_op, list_key, param = "describe_compute_environments", "computeEnvironments", "computeEnvironment"
    name_field, arn_field = "computeEnvironmentName", "computeEnvironmentArn"

    def read(self) -> Actual | None:
        actual = super().read()
        if actual and actual.data.get("status") == "DELETING":
            raise BackendError(f"{self.label} is being deleted: wait until it is gone (aws batch "
                               f"describe-compute-environments --compute-environments {self.name}), then rerun")
        return actual

    def changed_fields(self, actual: Actual) -> dict[str, Any]:
        """The computeResources fields whose desired value differs from AWS's (tags excluded)."""
        want = compute_resources(self.ctx.cfg, self.ctx.facts)
        have = actual.data.get("computeResources", {})
        out = {}
        for k, v in want.items():
            if k == "tags":
                continue
            h = have.get(k)
            if k in UNORDERED:
                same = sorted(v) == sorted(h or [])
            elif k == "launchTemplate":
                same = all((h or {}).get(f) == v[f] for f in ("launchTemplateId", "version"))
            else:
                same = h == v
            if not same:
                out[k] = v
        extra = set(have.get("securityGroupIds") or []) - {self.ctx.facts.security_group}
        if "securityGroupIds" not in want and extra:
            out["securityGroupIds"] = []  # the launch template's EFA interfaces carry the group
        return out

    def diff(self, actual: Actual) -> list[str]:
        have = actual.data.get("computeResources", {})
        out = [f"{k}: {_fmt(have.get(k))} -> {_fmt(v)}" for k, v in self.changed_fields(actual).items()]
        if actual.data.get("state") != "ENABLED":
            out.append(f"state: {actual.data.get('state')} -> ENABLED")
        want_role = self.ctx.facts.service_role_arn
        if actual.data.get("serviceRole") not in (None, want_role) and want_role != PENDING:
            out.append(f"serviceRole: {actual.data.get('serviceRole')} -> {want_role}")
        return out

    def create(self) -> Actual:
        req = compute_environment_request(self.ctx.cfg, self.ctx.facts)
        # a role or instance profile created seconds ago may not be visible to Batch yet (IAM propagation)
        got = self.ctx.retry(
            "IAM roles propagate", lambda: self.ctx.call("batch", "create_compute_environment", self.label, **req),
            IAM_PROPAGATION, "check the instance profile and the service-linked role exist in IAM",
            timeout=min(self.ctx.timeout, 120), match=("role", "profile"))
        actual = Actual(id=self.name, arn=got["computeEnvironmentArn"], data={"state": "ENABLED"})
        self.record(actual, created=True)
        self.wait_settled()
        return actual

    def update(self, actual: Actual, diffs: list[str]) -> Actual:
        params: dict[str, Any] = {"computeEnvironment": self.name}
        fields = self.changed_fields(actual)
        if fields:
            params["computeResources"] = fields
        if actual.data.get("state") != "ENABLED":
            params["state"] = "ENABLED"
        if any(d.startswith("serviceRole") for d in diffs):
            params["serviceRole"] = self.ctx.facts.service_role_arn
        self.ctx.call("batch", "update_compute_environment", self.label,
                      fix="instance types, subnets, launch template and AMI change in place only with the "
                          "BEST_FIT_PROGRESSIVE / SPOT_*_OPTIMIZED strategies stoker uses; a compute environment "
                          "made elsewhere may need `stoker infra destroy` and apply", **params)
        self.wait_settled()
        return actual

    def delete(self, actual: Actual, *, force: bool = False) -> None:
        self.disable_and_delete(actual)

    def publish(self, actual: Actual | None, changing: bool = False) -> None:
        self.ctx.facts.compute_environment_arn = actual.arn if actual and actual.arn else PENDING

    def describe(self, actual: Actual) -> str:
        cr = actual.data.get("computeResources", {})
        return (super().describe(actual)
                + f", {cr.get('minvCpus')}-{cr.get('maxvCpus')} vCPUs of {', '.join(cr.get('instanceTypes', []))}")


class JobQueue(BatchResource):
    key = "job_queue"
    kind = "job queue"
    describe_op, list_key, param = "describe_job_queues", "jobQueues", "jobQueue"
    name_field, arn_field = "jobQueueName", "jobQueueArn"

    def diff(self, actual: Actual) -> list[str]:
        want = job_queue_request(self.ctx.cfg, self.ctx.facts)
        d = actual.data
        out = []
        if d.get("state") != "ENABLED":
            out.append(f"state: {d.get('state')} -> ENABLED")
        if d.get("priority") != want["priority"]:
            out.append(f"priority: {d.get('priority')} -> {want['priority']}")
        have = [(o.get("order"), o.get("computeEnvironment")) for o in d.get("computeEnvironmentOrder", [])]
        if have != [(o["order"], o["computeEnvironment"]) for o in want["computeEnvironmentOrder"]]:
            out.append(f"compute environments: {_fmt([h[1] for h in have])} -> "
                       f"{self.ctx.names['compute_environment']}")
        return out

    def create(self) -> Actual:
        got = self.ctx.call("batch", "create_job_queue", self.label,
                            **job_queue_request(self.ctx.cfg, self.ctx.facts))
        actual = Actual(id=self.name, arn=got["jobQueueArn"], data={"state": "ENABLED"})
        self.record(actual, created=True)
        self.wait_settled()
        return actual

    def update(self, actual: Actual, diffs: list[str]) -> Actual:
        want = job_queue_request(self.ctx.cfg, self.ctx.facts)
        self.ctx.call("batch", "update_job_queue", self.label, jobQueue=self.name, state="ENABLED",
                      priority=want["priority"], computeEnvironmentOrder=want["computeEnvironmentOrder"])
        self.wait_settled()
        return actual

    def delete(self, actual: Actual, *, force: bool = False) -> None:
        self.disable_and_delete(actual)

    def live_jobs(self) -> list[dict[str, Any]]:
        """The jobs of the queue that have not ended (deleting the queue terminates them): ListJobs per status,
        every page, then DescribeJobs for their tags (`stoker:flow`, `stoker:run` on stoker's jobs)."""
        jobs: dict[str, dict[str, Any]] = {}
        for status in LIVE_STATUSES:
            params: dict[str, Any] = {"jobQueue": self.name, "jobStatus": status}
            while True:
                page = self.ctx.call("batch", "list_jobs", self.label, **params)
                for j in page.get("jobSummaryList", []):
                    jobs.setdefault(j["jobId"], {"jobId": j["jobId"], "jobName": j.get("jobName", ""),
                                                 "status": j.get("status") or status, "tags": {}})
                if not page.get("nextToken"):
                    break
                params["nextToken"] = page["nextToken"]
        ids = list(jobs)
        for i in range(0, len(ids), 100):  # DescribeJobs takes up to 100 ids
            got = self.ctx.call("batch", "describe_jobs", self.label, jobs=ids[i:i + 100])
            for d in got.get("jobs", []):
                if d.get("jobId") in jobs:
                    jobs[d["jobId"]]["tags"] = d.get("tags") or {}
        return list(jobs.values())

    def terminate(self, jobs: list[dict[str, Any]]) -> None:
        for j in jobs:
            self.ctx.call("batch", "terminate_job", self.label, jobId=j["jobId"], reason=TERMINATE_REASON)


def _fmt(v: Any) -> str:
    if v is None:
        return "(none)"
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return ",".join(x.rsplit("/", 1)[-1] for x in v) or "[]"
    if isinstance(v, dict):
        return ",".join(f"{k}={x}" for k, x in v.items())
    if isinstance(v, list):
        return ";".join(_fmt(x) for x in v)
    return str(v)
