"""The Batch backend against moto's Batch on loopback: checks before submitting, job definitions reused, batched
DescribeJobs, TerminateJob; and Batch descriptions -> JobStatus (each node names itself)."""

from __future__ import annotations

import pytest

from stoker.backends.aws.backend import BatchBackend
from stoker.backends.aws.client import BatchClient
from stoker.backends.aws.render import BatchOptions
from stoker.backends.aws.states import job_status, status_of
from stoker.errors import ConfigError
from stoker.runtime.contract import EXITED, QUEUED, RUNNING, JobRef
from tests.batch_emulator import make_queue
from tests.unit.backends.test_aws_render import batch, make_unit

pytestmark = pytest.mark.aws


class Recording:
    """A boto3 Batch client of moto's server that records each call's name and size."""

    def __init__(self, client) -> None:
        self.client, self.calls = client, []

    def __getattr__(self, name):
        fn = getattr(self.client, name)

        def call(**kw):
            self.calls.append((name, len(kw.get("jobs", []))))
            return fn(**kw)
        return call


KEY_SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:stoker/bucket/stoker/store-key-AbCdEf"


@pytest.fixture
def backend(aws, monkeypatch):
    monkeypatch.setenv("STOKER_STORE", "s3://bucket/stoker")
    make_queue("stoker-queue")
    rec = Recording(aws.client("batch"))
    opts = BatchOptions(queue="stoker-queue", image="img:1", region="us-east-1", use_infra=False,
                        instance_types=["trn1.32xlarge"], store_key_secret=KEY_SECRET)
    b = BatchBackend(options=opts, client=BatchClient("us-east-1", batch=rec, logs=aws.client("logs")))
    b.recorded = rec
    return b


def test_check_accepts_what_fits(backend):
    backend.check(make_unit("gang", 4, options=batch(trainium=16, efa=8, memory=480000)))


def test_a_gang_larger_than_the_compute_environment_is_refused(backend):
    """make_queue's compute environment allows 1024 vCPUs: 8 whole trn1.32xlarge nodes, not 9."""
    backend.check(make_unit("gang", 8, options=batch(trainium=16, efa=8, instance_type="trn1.32xlarge")))
    with pytest.raises(ConfigError, match=r"needs 1152 vCPUs at once \(128 a node on trn1.32xlarge\).*at most "
                                          r"1024.*max_vcpus"):
        backend.check(make_unit("gang", 9, options=batch(trainium=16, efa=8, instance_type="trn1.32xlarge")))


def test_spares_count_as_nodes_of_the_job(backend):
    """A gang of 7 with 1 spare is a job of 8 nodes (fits 1024 vCPUs); with 2 spares, 9 (does not), and the message
    says the spares are in it. The job's members are all its nodes (polled, tailed, paid for)."""
    assert backend.main_node_spare, "Batch ends a job when its main node exits: it is kept as the last spare"
    ok = make_unit("gang", 7, spares=1, first_slots=list(range(1, 8)),
                   options=batch(trainium=16, efa=8, instance_type="trn1.32xlarge"))
    backend.check(ok)
    with pytest.raises(ConfigError, match=r"a gang of 7 nodes and 2 spares needs 1152 vCPUs.*num_parallel or spares"):
        backend.check(make_unit("gang", 7, spares=2, first_slots=list(range(1, 8)),
                                options=batch(trainium=16, efa=8, instance_type="trn1.32xlarge")))
    ref = backend.submit(backend.materialize(make_unit("gang", 2, spares=1, first_slots=[1, 2],
                                                       options=batch(cpu=1))))
    assert ref.members == 3 and ref.task_ids == ["7", "8"]
    backend.recorded.calls.clear()
    backend.poll([ref])
    assert [n for c, n in backend.recorded.calls if c == "describe_jobs"] == [4], "the job and its 3 nodes"


def test_a_gang_on_a_spot_queue_is_refused(backend):
    make_queue("spot-queue", kind="SPOT")
    with pytest.raises(ConfigError, match="multi-node job, which Batch runs only on on-demand EC2.*SPOT"):
        backend.check(make_unit("gang", 2, options=batch(queue="spot-queue")))
    backend.check(make_unit("task", 1, options=batch(queue="spot-queue")))  # a single-node job may run there


def test_memory_over_what_ecs_sees_is_refused_with_the_number_that_fits(backend):
    unit = make_unit("gang", 4, options=batch(trainium=16, efa=8, memory=512 * 1024))
    with pytest.raises(ConfigError, match=r"memory=507821"):
        backend.check(unit)


@pytest.mark.parametrize("attrs, words", [
    ({"trainium": 32}, "trainium=32 but a trn1.32xlarge has 16 Trainium devices"),
    ({"efa": 16}, "efa=16 but a trn1.32xlarge has 8 EFA interfaces"),
    ({"gpu": 1}, "gpu=1 but a trn1.32xlarge has 0 GPUs"),
])
def test_requests_no_instance_can_take_are_refused(backend, attrs, words):
    with pytest.raises(ConfigError, match=words):
        backend.check(make_unit("task", 1, options=batch(**attrs)))


def test_a_local_store_is_refused(backend, tmp_path):
    unit = make_unit("task", 1)
    unit.store_url = str(tmp_path / "store")
    with pytest.raises(ConfigError, match="Batch containers cannot reach: use an S3 store"):
        backend.check(unit)


def test_no_store_key_secret_is_refused_before_anything_is_submitted(backend):
    """Without a secret the nodes could not read (or sign) a manifest: refused with the fix, nothing submitted."""
    backend.options.store_key_secret = None
    with pytest.raises(ConfigError, match="signing key.*`stoker infra apply`.*STOKER_STORE_KEY_SECRET"):
        backend.check(make_unit("task", 1))
    assert not [c for c in backend.recorded.calls if c[0] in ("submit_job", "register_job_definition")]


def test_a_run_with_secret_parameters_is_refused_for_batch(backend, monkeypatch):
    """A secret parameter's value lives only in the launcher's environment (STOKER_SECRET_*): a Batch container
    would fail (and be retried) reading it, so the step is refused up front, naming the parameter and the fix."""
    monkeypatch.setenv("STOKER_SECRET_HF_TOKEN", '"s3cr3t-value"')
    with pytest.raises(ConfigError, match=r"secret parameters \(hf_token\).*Secrets Manager") as e:
        backend.check(make_unit("task", 1))
    assert "s3cr3t" not in str(e.value)
    assert not [c for c in backend.recorded.calls if c[0] in ("submit_job", "register_job_definition")]


def test_missing_image_queue_and_unknown_queue(backend):
    backend.options.image = None
    with pytest.raises(ConfigError, match="no container image"):
        backend.check(make_unit("task", 1))
    backend.options.image, backend.options.queue = "img:1", None
    with pytest.raises(ConfigError, match="no job queue"):
        backend.check(make_unit("task", 1))
    with pytest.raises(ConfigError, match="'nope' does not exist"):
        backend.check(make_unit("task", 1, options=batch(queue="nope")))


def test_submit_reuses_the_definition_polls_in_batches_and_terminates(backend):
    refs = [backend.submit(backend.materialize(make_unit("gang", 2, options=batch(cpu=1)))) for _ in range(2)]
    names = [c for c, _ in backend.recorded.calls]
    assert names.count("register_job_definition") == 1, "the second submission reuses the definition"
    assert names.count("submit_job") == 2
    many = refs * 40  # 80 jobs of 2 nodes: 240 ids
    backend.recorded.calls.clear()
    statuses = backend.poll(many)
    sizes = [n for c, n in backend.recorded.calls if c == "describe_jobs"]
    assert sizes == [100, 100, 40], "one DescribeJobs call per 100 ids"
    assert set(statuses) == {r.job_id for r in refs}
    backend.cancel(refs[0])
    assert ("terminate_job", 0) in backend.recorded.calls


def test_a_failed_node_names_itself():
    parent = {"jobId": "j", "status": "FAILED", "statusReason": "Essential container in task exited",
              "startedAt": 1_700_000_000_000}
    nodes = {0: {"status": "FAILED", "container": {"exitCode": 143, "reason": "Terminated"}},
             1: {"status": "RUNNING"},
             2: {"status": "FAILED", "statusReason": "Essential container in task exited",
                 "container": {"exitCode": 137, "reason": "OutOfMemoryError: Container killed due to memory usage",
                               "networkInterfaces": [{"privateIpv4Address": "10.0.0.7"}]}}}
    st = job_status(parent, nodes)
    assert st.state == EXITED and st.exit_code == 1 and st.started_at == 1_700_000_000.0
    assert st.member(2).exit_code == 137 and "node 2: exit code 137" in st.member(2).reason
    assert "OutOfMemoryError" in st.member(2).reason and st.member(2).hosts == ["10.0.0.7"]
    assert st.member(1).state == RUNNING
    assert st.reason.startswith("node 0: exit code 143")


def test_a_node_whose_instance_was_lost_has_no_exit_code():
    """Batch reports a lost host as FAILED with `Host EC2 (instance ...) terminated.` and no exit code: no process
    exited (a gang with spares takes the node for lost, not failed); the job runs on with its main node."""
    parent = {"jobId": "j", "status": "RUNNING", "startedAt": 1_700_000_000_000}
    nodes = {0: {"status": "RUNNING"}, 1: {"status": "RUNNING"},
             2: {"status": "FAILED", "statusReason": "Host EC2 (instance i-0abc) terminated.", "container": {}}}
    st = job_status(parent, nodes)
    assert st.state == RUNNING and st.member(1).state == RUNNING
    lost = st.member(2)
    assert lost.state == EXITED and lost.exit_code is None
    assert lost.reason == "node 2: Host EC2 (instance i-0abc) terminated."
    gone = job_status({**parent, "status": "FAILED", "statusReason": "Host EC2 (instance i-0def) terminated."},
                      {**nodes, 0: {"status": "FAILED", "statusReason": "Host EC2 (instance i-0def) terminated."}})
    assert gone.state == EXITED and gone.exit_code is None and "Host EC2" in gone.reason
    other = status_of({"status": "FAILED", "statusReason": "Task failed to start", "container": {}})
    assert other.exit_code == 1, "any other failure without an exit code is a failure, as before"


def test_queued_states_and_blocked_jobs():
    assert status_of({"status": "RUNNABLE"}).state == QUEUED
    blocked = status_of({"status": "RUNNABLE", "statusReason": "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT - The job "
                         "resource requirement (vCPU/memory/GPU) is higher than that can be met by the CE(s)"})
    assert blocked.blocked and "MISCONFIGURATION" in blocked.reason
    gang = job_status({"status": "RUNNABLE", "statusReason": "MISCONFIGURATION:COMPUTE_ENVIRONMENT_MAX_RESOURCE"},
                      {i: {"status": "PENDING"} for i in range(4)})
    assert all(gang.member(i).blocked for i in range(4)), "child jobs already listed are blocked too"
    waiting = status_of({"status": "RUNNABLE", "statusReason": "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY"})
    assert not waiting.blocked, "no capacity now is worth waiting for"
    assert status_of({"status": "SUCCEEDED"}).exit_code == 0


def test_refs_survive_json(backend):
    ref = backend.submit(backend.materialize(make_unit("task", 1)))
    again = JobRef.from_json(ref.to_json())
    assert again.extra["queue"] == "stoker-queue" and again.extra["log_group"] == "/aws/batch/job"
    assert again.extra["instance_type"] == "trn1.32xlarge"


def test_jobs_of_another_region_are_reached_there(aws, monkeypatch):
    """`stoker kill` on a machine whose default region is not the job's: the job record's region wins."""
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    b = BatchBackend(options=BatchOptions(queue="q", image="i", use_infra=False))
    assert b.client.region_name() == "eu-west-1"
    ref = JobRef(backend="batch", job_id="j", extra={"region": "us-east-1"})
    assert b._for(ref).region_name() == "us-east-1" and b._for(ref) is b._for(ref)
    assert b._for(JobRef(backend="batch", job_id="k", extra={"region": "eu-west-1"})) is b.client
    assert b.poll([ref]) == {}  # asked in us-east-1, where moto knows no such job
