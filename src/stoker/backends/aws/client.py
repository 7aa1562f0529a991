"""The Batch and CloudWatch Logs calls the backend makes, in one injectable object.

`batch` and `logs` are boto3 clients (made from `session.aws_client` unless given): tests pass clients of moto's
server, or a Batch emulation that also runs the containers as local processes.
"""

from __future__ import annotations

from typing import Any

from stoker.backends.aws.session import aws_client, aws_error, error_code

DESCRIBE_MAX = 100  # DescribeJobs takes at most 100 ids per call


class BatchClient:
    def __init__(self, region: str | None = None, batch: Any = None, logs: Any = None) -> None:
        self.region = region
        self._batch, self._logs = batch, logs
        self._definitions: dict[str, str] = {}  # name -> arn, registered or found by this client

    def region_name(self) -> str | None:
        """The region the calls go to (given, else the one boto3 resolved)."""
        return self.region or getattr(getattr(self.batch, "meta", None), "region_name", None)

    @property
    def batch(self) -> Any:
        if self._batch is None:
            self._batch = aws_client("batch", self.region)
        return self._batch

    @property
    def logs(self) -> Any:
        if self._logs is None:
            self._logs = aws_client("logs", self.region)
        return self._logs

    def ensure_definition(self, definition: dict[str, Any]) -> str:
        """The ARN of an ACTIVE job definition with this (content-hashed) name, registering it when missing."""
        name = definition["jobDefinitionName"]
        if name in self._definitions:
            return self._definitions[name]
        try:
            found = self.batch.describe_job_definitions(jobDefinitionName=name, status="ACTIVE")["jobDefinitions"]
            if found:
                arn = max(found, key=lambda d: d.get("revision", 0))["jobDefinitionArn"]
            else:
                arn = self.batch.register_job_definition(**definition)["jobDefinitionArn"]
        except Exception as e:  # noqa: BLE001 - botocore's errors, named below
            raise aws_error(e, "RegisterJobDefinition", f"job definition {name}") from e
        self._definitions[name] = arn
        return arn

    def queue(self, name: str) -> dict[str, Any] | None:
        """The job queue `name` (DescribeJobQueues), None when Batch does not know it."""
        try:
            found = self.batch.describe_job_queues(jobQueues=[name])["jobQueues"]
        except Exception as e:  # noqa: BLE001
            raise aws_error(e, "DescribeJobQueues", f"job queue {name}") from e
        return found[0] if found else None

    def compute_environments(self, queue: dict[str, Any]) -> list[dict[str, Any]]:
        """The compute environments a job queue places jobs on (DescribeComputeEnvironments)."""
        arns = [c["computeEnvironment"] for c in queue.get("computeEnvironmentOrder", [])]
        if not arns:
            return []
        try:
            return self.batch.describe_compute_environments(computeEnvironments=arns)["computeEnvironments"]
        except Exception as e:  # noqa: BLE001
            raise aws_error(e, "DescribeComputeEnvironments",
                            f"the compute environments of {queue.get('jobQueueName')}") from e

    def submit(self, request: dict[str, Any]) -> str:
        try:
            return self.batch.submit_job(**request)["jobId"]
        except Exception as e:  # noqa: BLE001
            fix = ""
            if error_code(e) == "ClientException" and "queue" in str(e).lower():
                fix = "run `stoker infra apply`, or set @batch(queue=...) / STOKER_BATCH_QUEUE to an existing queue"
            raise aws_error(e, "SubmitJob", f"job {request.get('jobName')}", fix) from e

    def describe(self, ids: list[str]) -> dict[str, dict[str, Any]]:
        """Descriptions by job id, in calls of at most 100 ids (ids Batch does not know are left out)."""
        out: dict[str, dict[str, Any]] = {}
        for i in range(0, len(ids), DESCRIBE_MAX):
            chunk = ids[i:i + DESCRIBE_MAX]
            try:
                jobs = self.batch.describe_jobs(jobs=chunk)["jobs"]
            except Exception as e:  # noqa: BLE001
                raise aws_error(e, "DescribeJobs", f"{len(chunk)} jobs") from e
            out.update({j["jobId"]: j for j in jobs})
        return out

    def terminate(self, job_id: str, reason: str) -> None:
        try:
            self.batch.terminate_job(jobId=job_id, reason=reason[:256])
        except Exception as e:  # noqa: BLE001
            raise aws_error(e, "TerminateJob", f"job {job_id}") from e

    def log_events(self, group: str, stream: str, token: str | None = None) -> tuple[list[str], str | None]:
        """New lines of one log stream since `token` (None: from the start), and the token to go on from."""
        kwargs: dict[str, Any] = {"logGroupName": group, "logStreamName": stream, "startFromHead": True}
        lines: list[str] = []
        for _ in range(50):  # pages of up to 10,000 events; stop when the token stops moving
            if token:
                kwargs["nextToken"] = token
            try:
                resp = self.logs.get_log_events(**kwargs)
            except Exception as e:  # noqa: BLE001
                if error_code(e) == "ResourceNotFoundException":
                    return lines, token  # the stream does not exist yet
                raise aws_error(e, "GetLogEvents", f"log stream {group}/{stream}") from e
            lines += [ev.get("message", "") for ev in resp.get("events", [])]
            nxt = resp.get("nextForwardToken")
            if not resp.get("events") or nxt == token:
                return lines, nxt or token
            token = nxt
        return lines, token

