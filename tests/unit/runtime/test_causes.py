"""Failure attribution (issue 25): each row of docs/operations.md's "Why an attempt failed" table, case by case --
manifest, engine status and log tail in, one cause out -- and what the cause means for the retries."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from stoker.runtime.contract import EXITED, JobStatus
from stoker.runtime.driver.causes import (
    CANCELLED,
    CONFIG,
    DATA,
    HANG,
    LABELS,
    NETWORK,
    NEVER,
    NODE,
    OOM,
    POLICY,
    PREEMPTION,
    RETRY,
    STOKER,
    TIME_LIMIT,
    UNLESS_REPEATED,
    USER,
    classify,
    normalize,
    signal_of,
)

USER_TB = ('Traceback (most recent call last):\n  File "/site/stoker/runtime/member/task.py", line 150, in _run_step\n'
           '    call()\n  File "/home/me/flows/train_flow.py", line 21, in work\n    raise ValueError("bad shape")\n'
           'ValueError: bad shape\n')
STOKER_TB = ('Traceback (most recent call last):\n  File "/site/stoker/runtime/member/task.py", line 90, in run_task\n'
             '    parents = _load(spec)\n  File "/usr/lib/python3.11/json/__init__.py", line 346, in loads\n'
             "AttributeError: 'NoneType' object has no attribute 'get'\n")
TORCHRUN = "torchrun exited with code 1 on node 0 (torchrun ... -m stoker.train; the whole command is at the top)"
CUDA_OOM = ("[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
            "capacity of 79.10 GiB of which 1.19 GiB is free.\n")
GLOO = ("[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
        "[127.0.0.1]:36177\n")
NCCL = ("[rank3]:[E ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=481, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600042 milliseconds before timing out.\n")
TORCHRUN_REPORT = ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
                   "Root Cause (first observed failure):\n[0]:\n  exitcode  : 1 (pid: 4242)\n")


def exc(type_: str, message: str = "", traceback: str = "", **flags) -> dict:
    return {"exception": {"type": type_, "message": message, "traceback": traceback, **flags}}


def died(how: str = "killed by signal SIGKILL") -> dict:
    return exc("TaskDied", f"task process {how}")


def st(code: int | None = None, reason: str | None = None) -> JobStatus:
    return JobStatus(EXITED, exit_code=code, reason=reason)


# (id, manifest, status, log tail, stop reason, host OOM, expected kind, a phrase of the evidence)
CASES = [
    # user code error
    ("raised-in-step", exc("ValueError", "bad shape", USER_TB), st(1), "", None, False, USER, "ValueError: bad shape"),
    ("torchrun-worker-raised", exc("StokerError", TORCHRUN), st(1),
     "[rank0]: KeyError: 'labels'\n" + TORCHRUN_REPORT, None, False, USER, "KeyError: 'labels'"),
    ("os-exit-no-manifest", died("exited with code 3"), st(3), "", None, False, USER, "exited with code 3"),
    ("segfault", died("killed by signal SIGSEGV"), st(-11), "Fatal Python error: Segmentation fault", None, False,
     USER, "SIGSEGV"),
    # configuration error
    ("config-error", exc("ConfigError", "train.stepz is not a setting", permanent=True), st(78), "", None, False,
     CONFIG, "train.stepz"),
    ("exit-78-bare", died("exited with code 78"), st(78), "", None, False, CONFIG, "exit code 78"),
    ("preflight", exc("PreflightError", "preflight failed on node 1 (n2), check gpu", permanent=True), st(78), "",
     None, False, CONFIG, "preflight failed"),
    ("missing-module", exc("ModuleNotFoundError", "No module named 'flash_attn'"), st(1), "", None, False, CONFIG,
     "flash_attn"),
    ("never-starts", died("killed by signal SIGKILL"), st(-9), "",
     "the engine can never start it (Slurm will never start it (BadConstraints))", False, CONFIG, "BadConstraints"),
    ("command-not-found", died("exited with code 127"), st(127), "torchrun: command not found", None, False, CONFIG,
     "exit code 127"),
    ("batch-image", died(), st(1, "CannotPullContainerError: pull image manifest has been retried 5 time(s)"), "",
     None, False, CONFIG, "CannotPullContainerError"),
    # out of memory
    ("slurm-oom", died(), st(-9, "ran out of memory (raise @slurm(mem=...))"), "", None, False, OOM,
     "ran out of memory"),
    ("batch-oom", died(), st(137, "OutOfMemoryError: Container killed due to memory usage"), "", None, False, OOM,
     "memory usage"),
    ("cuda-oom-log", exc("StokerError", TORCHRUN), st(1), CUDA_OOM + TORCHRUN_REPORT, None, False, OOM,
     "CUDA out of memory"),
    ("cuda-oom-raised", exc("OutOfMemoryError", "CUDA out of memory. Tried to allocate 20.00 MiB"), st(1), "",
     None, False, OOM, "CUDA out of memory"),
    ("host-memoryerror", exc("MemoryError", ""), st(1), "", None, False, OOM, "MemoryError"),
    ("host-oom-killer", died(), st(-9), "", None, True, OOM, "OOM killer"),
    ("neuron-oom", exc("StokerError", TORCHRUN), st(1), "2026-Jan-01 ERROR NRT:nrt_tensor_allocate failed: "
     "NRT_RESOURCE (out of device memory)\n", None, False, OOM, "NRT_RESOURCE"),
    # node lost / engine failure
    ("slurm-node-fail", exc("StokerError", TORCHRUN), st(-15, "a node failed"), GLOO, None, False, NODE,
     "a node failed"),
    ("engine-lost-job", died(), st(-9, "the slurm engine lost job 41"), "", None, False, NODE, "lost job 41"),
    ("batch-host-gone", died(), st(1, "Host EC2 (instance i-0abc) terminated."), "", None, False, NODE, "Host EC2"),
    ("local-sigkill", died(), st(-9), "", None, False, NODE, "killed by SIGKILL from outside stoker"),
    ("heartbeats-stopped", exc("NodeLost", "node 1 (n2) was lost: no heartbeat for 6.2 s"), st(-9), "", None, False,
     NODE, "no heartbeat"),
    ("survivor-of-a-lost-node", died("killed by signal SIGTERM"), st(-15), GLOO, "node 1 of its gang was lost", False,
     NODE, "was lost"),
    ("rank-sigkill", exc("StokerError", TORCHRUN), st(1),
     "torch.distributed.elastic.multiprocessing.api:[ERROR] failed (exitcode: -9) local_rank: 1 (pid: 77)\n",
     None, False, NODE, "exitcode: -9"),
    ("neuron-runtime", exc("StokerError", TORCHRUN), st(1),
     "2026-Jan-01 ERROR NRT:nrt_execute  failed to execute model, status=4\n", None, False, NODE, "nrt_execute"),
    ("gpu-ecc", exc("StokerError", TORCHRUN), st(1), "RuntimeError: CUDA error: uncorrectable ECC error encountered\n",
     None, False, NODE, "ECC"),
    # network / collective timeout
    ("gloo-peer-closed", exc("StokerError", TORCHRUN), st(1), GLOO + TORCHRUN_REPORT, None, False, NETWORK,
     "Connection closed by peer"),
    ("nccl-watchdog", exc("StokerError", TORCHRUN), st(1), NCCL, None, False, NETWORK, "Watchdog caught"),
    ("nccl-raised", exc("DistBackendError", "NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited"),
     st(1), "", None, False, NETWORK, "NCCL error"),
    ("rendezvous", exc("RendezvousTimeoutError", "The node failed to join the rendezvous"), st(1), "", None, False,
     NETWORK, "RendezvousTimeoutError"),
    # preemption
    ("preempted", exc("Preempted", "stopped by SIGTERM after step 3", preempted=True, resume_step=3), st(75), "",
     None, False, PREEMPTION, "at step 3"),
    ("exit-75", died("exited with code 75"), st(75), "", None, False, PREEMPTION, "exit code 75"),
    ("slurm-preempted", died("killed by signal SIGTERM"), st(-15, "preempted"), "", None, False, PREEMPTION,
     "preempted"),
    # time limit
    ("timeout-stop", died(), st(-9), "", "it exceeded its @timeout", False, TIME_LIMIT, "@timeout"),
    ("step-timeout", exc("StepTimeout", "step timed out after 1 s (@timeout)"), st(1), "", None, False, TIME_LIMIT,
     "timed out after 1 s"),
    ("slurm-timeout", died(), st(-15, "hit the Slurm time limit (raise @slurm(time=...))"), "", None, False,
     TIME_LIMIT, "Slurm time limit"),
    ("batch-timeout", died(), st(1, "Job attempt duration exceeded timeout"), "", None, False, TIME_LIMIT,
     "duration exceeded"),
    # data / IO error
    ("data-error", exc("DataError", "shard 3 of /data/tok is truncated"), st(1), "", None, False, DATA, "truncated"),
    ("corrupt-checkpoint", exc("CheckpointError", "checkpoint step 40: sha256 mismatch"), st(1), "", None, False,
     DATA, "sha256"),
    ("disk-full-saving", exc("OSError", "saving artifacts failed: [Errno 28] No space left on device"), st(1), "",
     None, False, DATA, "No space left"),
    ("disk-full-log", exc("StokerError", TORCHRUN), st(1), "OSError: [Errno 28] No space left on device\n", None,
     False, DATA, "No space left"),
    # stoker's own error
    ("untrusted", exc("UntrustedManifest", "its manifest cannot be trusted: bad signature"), st(1), "", None, False,
     STOKER, "cannot be trusted"),
    ("bug-in-stoker", exc("AttributeError", "'NoneType' object has no attribute 'get'", STOKER_TB), st(1), "",
     None, False, STOKER, "raised in stoker"),
    # cancelled
    ("scancel-outside", died("killed by signal SIGTERM"), st(-15, "cancelled (scancel)"), "", None, False, CANCELLED,
     "stoker did not ask for it"),
    ("stopped-by-stoker", died("killed by signal SIGTERM"), st(-15), "", "another task failed", False, CANCELLED,
     "another task failed"),
    ("hang", exc("TaskHang", "no progress for 1800 s (hang timeout 1800 s, the default for gangs)"), st(1), GLOO,
     None, False, HANG, "no progress for 1800 s"),
    ("hang-ended-by-its-watchdog", died("exited with code 79"), st(79), "", None, False, HANG,
     "the task's watchdog ended it"),
]


@pytest.mark.parametrize("manifest,status,tail,stop,host_oom,kind,phrase", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_each_failure_gets_its_cause(manifest, status, tail, stop, host_oom, kind, phrase):
    c = classify(manifest, status, tail, stop_reason=stop, host_oom=host_oom)
    assert (c.kind, c.retry) == (kind, POLICY[kind]), c
    assert phrase in c.evidence, c
    assert "\n" not in c.evidence and len(c.evidence) <= 300


def test_every_cause_is_covered_and_has_a_policy():
    assert {c[6] for c in CASES} == set(LABELS) == set(POLICY)
    assert {k for k, p in POLICY.items() if p == NEVER} == {CONFIG, STOKER, CANCELLED}
    assert {k for k, p in POLICY.items() if p == RETRY} == {NODE, NETWORK, TIME_LIMIT, HANG}
    assert {k for k, p in POLICY.items() if p == UNLESS_REPEATED} == {USER, OOM, DATA}


def test_a_specific_exception_is_not_overruled_by_noise_in_the_log():
    """A user's own exception is the evidence; a warning in the log does not turn it into a network failure."""
    c = classify(exc("ValueError", "bad shape", USER_TB), st(1), "NCCL WARN NET/Plugin: no plugin found\n")
    assert c.kind == USER


def test_signals_from_exit_codes():
    assert [signal_of(c) for c in (-9, 137, 143, 1, 0, None, 78)] == [9, 9, 15, None, None, None, None]


def test_same_failure_again_ignores_numbers_only_where_they_vary():
    a = classify(exc("StokerError", TORCHRUN), st(1), CUDA_OOM)
    b = classify(exc("StokerError", TORCHRUN), st(1), CUDA_OOM.replace("1.19 GiB", "1.07 GiB"))
    assert a.signature == b.signature
    assert normalize("KeyError at 0x7f3a2b pid 4242 rank 3") == "KeyError at 0x? pid ? rank ?"
    assert classify(exc("ValueError", "step 3"), st(1)).signature != classify(exc("ValueError", "step 4"),
                                                                             st(1)).signature


# -- the run's decisions (runtime/driver/attribution.py) --------------------------------------------------------
class _Backend:
    def __init__(self, name: str = "slurm", excludes: bool = True) -> None:
        self.name, self.remote, self.excludes_hosts = name, True, excludes


def _task(tid: str, node: int | None = None, *, manifest: dict, code: int = 1, reason: str | None = None,
          stop: str | None = None, hosts: tuple[str, ...] = ("n1", "n2"), backend=None, attempt: int = 0):
    job = SimpleNamespace(extra={"hosts": list(hosts)}, members=len(hosts) if node is not None else 1)
    m = {"flow": "F", "run_id": "1", "step": "train", "task_id": tid, "attempt": attempt, "status": "failed",
         "started_at": 0.0, "finished_at": 1.0, "artifacts": {}, **manifest}
    return SimpleNamespace(task_id=tid, attempt=attempt, step="train", gang="g1" if node is not None else None,
                           parallel=SimpleNamespace(node_index=node) if node is not None else None, member=node or 0,
                           job=job, manifest=m, exit_code=code, engine_reason=reason, stop_reason=stop,
                           backend=backend or _Backend(), output=None, unit_key="g1" if node is not None else tid,
                           max_attempts=3)


def _book():
    from stoker.runtime.driver.attribution import Attribution

    return Attribution(store=None, oom_kills=lambda: None)


def test_a_lost_node_is_blamed_not_the_survivor_that_saw_it_go():
    book = _book()
    survivor = _task("2", 0, manifest=exc("StokerError", TORCHRUN))
    lost = _task("3", 1, manifest=died(), code=-9)
    book.causes[("2", 0)] = classify(survivor.manifest, st(1), GLOO)
    book.cause_of(lost, lost.manifest)
    c = book.unit_cause([survivor, lost], survivor)
    assert c.kind == NODE and c.evidence.startswith("node 1 (n2): killed by SIGKILL"), c


def test_a_node_the_engine_stopped_does_not_overrule_a_collective_timeout():
    book = _book()
    first = _task("2", 0, manifest=exc("StokerError", TORCHRUN))
    peer = _task("3", 1, manifest=died("killed by signal SIGTERM"), code=-15)  # srun ended it: a guess, not a cause
    book.causes[("2", 0)] = classify(first.manifest, st(1), NCCL)
    book.cause_of(peer, peer.manifest)
    assert book.unit_cause([first, peer], first).kind == NETWORK


def test_a_node_stopped_with_its_gang_inherits_the_cause():
    book = _book()
    first = _task("2", 0, manifest=exc("OutOfMemoryError", "CUDA out of memory"))
    peer = _task("3", 1, manifest=died("killed by signal SIGTERM"), code=-15, stop="gang")
    assert book.cause_of(first, first.manifest).kind == OOM
    c = book.cause_of(peer, peer.manifest)
    assert c.kind == OOM and c.evidence.startswith("stopped with its gang: node 0 failed")
    assert book.unit_cause([first, peer], first).kind == OOM


def test_deterministic_causes_are_not_retried_and_an_identical_repeat_stops():
    book = _book()
    t = _task("5", manifest=exc("ConfigError", "x", permanent=True))
    line = book.verdict([t], t, book.cause_of(t, t.manifest))
    assert line.startswith("configuration error is deterministic") and "fix it and run again" in line
    u0 = _task("6", manifest=exc("ValueError", "boom"))
    assert book.verdict([u0], u0, book.cause_of(u0, u0.manifest)) is None  # a first user error: retried
    u1 = _task("6", manifest=exc("ValueError", "boom"), attempt=1)
    assert "repeated identically on attempt 1" in book.verdict([u1], u1, book.cause_of(u1, u1.manifest))
    n = _task("7", manifest=died(), code=-9)
    for attempt in range(3):  # infrastructure: retried however often it repeats
        n.attempt = attempt
        assert book.verdict([n], n, book.cause_of(n, n.manifest)) is None


def test_infrastructure_retries_without_retry_only_when_asked(monkeypatch):
    book = _book()
    t = _task("8", manifest=died(), code=-9)
    c = book.cause_of(t, t.manifest)
    assert book.free_attempt([t], t, c) is None and t.max_attempts == 3
    monkeypatch.setenv("STOKER_INFRA_RETRIES", "1")
    assert "infrastructure retry 1 of at most 1" in book.free_attempt([t], t, c) and t.max_attempts == 4
    assert book.free_attempt([t], t, c) is None


def test_a_host_that_failed_twice_is_excluded_where_the_engine_can_choose():
    from stoker.runtime.contract import Unit

    book = _book()
    slurm = _Backend()
    for attempt in range(2):
        survivor = _task("2", 0, manifest=exc("StokerError", TORCHRUN), backend=slurm, attempt=attempt)
        lost = _task("3", 1, manifest=died(), code=-9, backend=slurm, attempt=attempt)
        book.cause_of(lost, lost.manifest)
        c = book.unit_cause([survivor, lost], lost)
        line = book.blame([survivor, lost], lost, c)
    assert line and "host n2 failed 2 times" in line
    unit = Unit(kind="gang", flow="F", run_id="1", step="train", specs=[])
    book.exclude(unit, slurm)
    assert unit.exclude_hosts == ["n2"]
    batch = Unit(kind="gang", flow="F", run_id="1", step="train", specs=[])
    book.exclude(batch, _Backend("batch", excludes=False))
    assert batch.exclude_hosts == []


def test_the_cause_is_stored_in_the_failed_manifest(tmp_path):
    from stoker.runtime.driver.attribution import Attribution
    from stoker.store.blobs import open_store
    from stoker.store.manifest import read_manifest

    store = open_store(str(tmp_path / "store"))
    book = Attribution(store, oom_kills=lambda: None)
    t = _task("9", manifest=exc("ConfigError", "x", permanent=True))
    m = book.record(t, t.manifest)
    stored = read_manifest(store, "F", "1", "train", "9", 0)["exception"]
    assert (m["exception"]["cause"], stored["cause"]) == (CONFIG, CONFIG) and stored["evidence"] == "ConfigError: x"


def test_stoker_show_names_each_failed_attempts_cause():
    import datetime as dt

    from stoker.cli.listing import show_lines

    failed = [{"attempt": 0, "type": "StokerError", "message": "torchrun exited", "cause": OOM,
               "evidence": "log: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"},
              {"attempt": 1, "type": "TaskDied", "message": "killed", "cause": None, "evidence": None}]
    rec = {"pathspec": "F/1", "status": "failed", "user": "u", "duration_s": 3.0, "origin_run_id": None, "tags": [],
           "parameters": {}, "cost": None,
           "steps": [{"name": "train", "tasks": [{"id": "2", "attempt": 1, "successful": False, "artifacts": [],
                                                   "exception": {"type": "TaskDied", "message": "killed"},
                                                   "failed_attempts": failed}]}]}
    lines = show_lines(rec, dt.datetime(2026, 1, 2), 80)
    text = " ".join(" ".join(lines).split())
    assert all(len(line) <= 80 for line in lines), lines
    assert "attempt 0 failed: out of memory: log: torch.OutOfMemoryError: CUDA out of memory" in text, text
    assert "attempt 1 failed: cause not recorded (TaskDied: killed)" in text  # a manifest from before causes


def test_slurm_keeps_a_retry_off_the_excluded_hosts():
    from stoker.backends.slurm.render import SlurmOptions, render_sbatch
    from stoker.runtime.contract import Unit
    from stoker.runtime.spec import TaskSpec

    specs = [TaskSpec(flow="F", run_id="1", step="train", task_id=str(i), attempt=2) for i in (2, 3)]
    unit = Unit(kind="gang", flow="F", run_id="1", step="train", specs=specs, store_url="/s", code_key="c",
                spec_key="s", flow_path="f.py")
    opts = SlurmOptions(python="/py", log_dir="/shared/slurm")
    assert "--exclude" not in render_sbatch(unit, opts)
    unit.exclude_hosts = ["n2", "n3"]
    assert "#SBATCH --exclude=n2,n3" in render_sbatch(unit, opts).splitlines()


def test_a_refused_submission_gets_a_cause_too():
    from stoker.runtime.driver.attribution import Attribution

    m = Attribution.refused(exc("ConfigError", "@slurm(partition='gpu'): no such partition; pick one of: cpu"))
    assert m["exception"]["cause"] == CONFIG
    m = Attribution.refused(exc("BackendError", "sbatch: error: Batch job submission failed: Socket timed out"))
    assert m["exception"]["cause"] == NODE and "refused the submission" in m["exception"]["evidence"]


NAN_LOG = ("[rank0] 2026-12-07 20:01:02 stoker.train INFO step 11 loss 7.1234 lr 3.00e-03\n"
           "[rank0] error: loss is nan at step 12 (lr 0.003, grad norm nan); hint: lower train.lr, raise "
           "train.warmup_steps, keep train.grad_clip > 0, use fp32 or check the data; resume from the last checkpoint "
           "(none yet)\n" + TORCHRUN_REPORT)


@pytest.mark.parametrize("manifest, tail", [
    (exc("StokerError", TORCHRUN), NAN_LOG),  # torchrun exited 1: the rank's line in the log says it
    (exc("TrainingError", "loss is nan at step 12 (lr 0.003, grad norm nan)"), ""),  # the step's own exception
    (exc("ConfigError", "rank 0: loss is nan at step 12 (lr 0.003, grad norm nan)", permanent=True), ""),
])
def test_a_nan_loss_names_its_step_and_value_and_is_never_retried(manifest, tail):
    """Issue 34, item 13: not "torchrun exited with code 1", and not retried as is (deterministic)."""
    c = classify(manifest, st(1), tail)
    assert c.kind == USER and c.retry == NEVER
    assert c.evidence.startswith("the loss was nan at step 12") and "torchrun exited" not in c.evidence
    assert not c.weak
    book = _book()
    t = _task("5", manifest=manifest)
    book._tail = lambda *_: tail  # the attempt's log
    assert book.verdict([t], t, book.cause_of(t, t.manifest)).startswith("user code error is deterministic")
