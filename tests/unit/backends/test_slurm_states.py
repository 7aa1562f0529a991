"""Slurm's answers -> JobStatus, from lines recorded on the localhost test cluster (tests/slurm_cluster.py:
Slurm 22.05, no slurmdbd, JobCompType=jobcomp/filetxt) on 2026-12-03:

    27 `true` -> COMPLETED        28 `exit 3` -> FAILED          29 `sleep 300`, scancel -> CANCELLED
    30 --time=1 -> TIMEOUT        31 --array=0-4%2, element i exits i   32 --begin=now+600 -> PENDING
    33 --nodelist=n3, slurmd n3 killed -> NODE_FAIL

scontrol_end.txt is `scontrol -o show job` after all ended; scontrol_array_running.txt is the array while
elements 0 and 1 ran (2-4 pending behind the throttle); sacct_completion.txt is `sacct -c -n -P -o
JobID,State,ExitCode,NodeList,Start` (the completion log: NODE_FAIL and TIMEOUT read 0:0 there).
The sacct (slurmdbd) lines below are NOT recorded here (no slurmdbd on this host): they follow sacct's
documented `-P` output for the same jobs.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from stoker.backends.slurm.client import (
    SlurmClient,
    gres_gpus,
    parse_completion,
    parse_sacct,
    parse_scontrol_jobs,
    parse_sinfo,
    scontrol_fields,
)
from stoker.backends.slurm.states import exit_code, job_status, state_kind
from stoker.errors import BackendError
from stoker.runtime.contract import JobRef

REC = Path(__file__).with_name("slurm_recorded")
SACCT_DBD = """27|COMPLETED|0:0|2026-12-03T12:01:42|n1|None
28|FAILED|3:0|2026-12-03T12:01:42|n1|None
29|CANCELLED by 0|0:15|2026-12-03T12:01:42|n2|None
30|TIMEOUT|0:15|2026-12-03T12:01:42|n2|None
31_0|COMPLETED|0:0|2026-12-03T12:01:50|n3|None
31_1|FAILED|1:0|2026-12-03T12:01:50|n3|None
31_[2-4%2]|PENDING|0:0|Unknown|None assigned|JobArrayTaskLimit
32|PENDING|0:0|Unknown|None assigned|BeginTime
33|NODE_FAIL|0:0|2026-12-03T12:01:42|n3|None
40|OUT_OF_MEMORY|0:125|2026-12-03T12:05:00|gpu[07-08]|None
"""


def ref(job: str, kind: str = "task", members: int = 1) -> JobRef:
    return JobRef(backend="slurm", job_id=job, kind=kind, members=members)


def by_job(records):
    out = {}
    for r in records:
        out.setdefault(r.job, []).append(r)
    return out


def test_scontrol_lines_recorded_on_the_test_cluster():
    recs = by_job(parse_scontrol_jobs((REC / "scontrol_end.txt").read_text()))
    st = {j: job_status(ref(j), recs[j]) for j in ("27", "28", "29", "30", "32", "33")}
    assert (st["27"].state, st["27"].exit_code, st["27"].reason, st["27"].hosts) == ("exited", 0, None, ["n1"])
    assert (st["28"].exit_code, st["28"].reason) == (3, None)
    assert (st["29"].exit_code, st["29"].reason) == (-15, "cancelled (scancel)")
    assert st["30"].reason == "hit the Slurm time limit (raise @slurm(time=...))" and st["30"].exit_code == -15
    assert st["33"].exit_code == -15 and st["33"].reason.startswith("a node failed (NODE_FAIL")
    assert st["32"].state == "queued" and st["32"].started_at is None and st["32"].reason == "Slurm: BeginTime"
    assert st["27"].started_at is not None and isinstance(st["27"].started_at, float)
    array = job_status(ref("31", "array", 5), recs["31"])
    assert array.state == "exited" and [array.members[i].exit_code for i in range(5)] == [0, 1, 2, 3, 4]
    assert array.exit_code == 1 and sorted(array.hosts) == array.hosts and len(array.members) == 5


def test_a_running_array_with_a_throttled_rest():
    recs = parse_scontrol_jobs((REC / "scontrol_array_running.txt").read_text())
    st = job_status(ref("31", "array", 5), recs)
    assert st.state == "running"
    assert [st.members[i].state for i in range(5)] == ["running", "running", "queued", "queued", "queued"]
    assert st.members[3].reason == "Slurm: JobArrayTaskLimit" and st.exit_code is None


def test_completion_log_recorded_on_the_test_cluster():
    recs = by_job(parse_completion((REC / "sacct_completion.txt").read_text()))
    assert job_status(ref("28"), recs["28"]).exit_code == 3
    # the completion log says 0:0 for these; they must not look like successes
    assert job_status(ref("29"), recs["29"]).exit_code == -15
    assert job_status(ref("33"), recs["33"]).reason.startswith("a node failed") and recs["33"][0].exit_code == "0:0"
    assert job_status(ref("30"), recs["30"]).exit_code != 0


def test_sacct_lines():
    recs = by_job(parse_sacct(SACCT_DBD))
    assert job_status(ref("29"), recs["29"]).reason == "cancelled (scancel)"  # "CANCELLED by 0"
    oom = job_status(ref("40"), recs["40"])
    assert (oom.exit_code, oom.reason, oom.hosts) == (-125, "ran out of memory (raise @slurm(mem=...))",
                                                       ["gpu07", "gpu08"])
    arr = job_status(ref("31", "array", 5), recs["31"])
    assert arr.state == "running" and arr.members[1].exit_code == 1 and arr.members[4].state == "queued"
    assert job_status(ref("32"), recs["32"]).hosts == []


@pytest.mark.parametrize("state, code, expected", [
    ("COMPLETED", "0:0", 0), ("FAILED", "3:0", 3), ("FAILED", "0:9", -9), ("FAILED", "143:0", 143),
    ("CANCELLED", "0:0", -15), ("CANCELLED by 1000", "0:15", -15), ("TIMEOUT", "0:0", -15),
    ("NODE_FAIL", "0:0", -15), ("OUT_OF_MEMORY", "0:0", -9), ("FAILED", "0:0", 1), ("BOOT_FAIL", "0:0", 1),
])
def test_exit_codes(state, code, expected):
    assert exit_code(state, code) == expected


@pytest.mark.parametrize("state, kind", [
    ("PENDING", "queued"), ("CONFIGURING", "queued"), ("RUNNING", "running"), ("COMPLETING", "running"),
    ("COMPLETED", "exited"), ("PREEMPTED", "exited"), ("DEADLINE", "exited"), ("REQUEUED", "queued"),
])
def test_state_kinds(state, kind):
    assert state_kind(state) == kind


def test_scontrol_fields_keep_spaces_and_odd_keys():
    kv = scontrol_fields("JobId=5 JobName=my job AllocNode:Sid=vm:12 CPUs/Task=2 ReqNodeList=(null) NodeList=n[1-2]")
    assert kv["JobName"] == "my job" and kv["AllocNode:Sid"] == "vm:12" and kv["CPUs/Task"] == "2"
    assert kv["NodeList"] == "n[1-2]" and kv["ReqNodeList"] == "(null)"


def test_sinfo_and_gres():
    parts = parse_sinfo("debug*|3|2|4000|(null)|up|infinite\ngpu|4|64|512000|gpu:a100:8(S:0-1)|up|2-00:00:00\n"
                        "gpu|2|32|256000|gpu:v100:4|up|2-00:00:00\n")
    assert parts["debug"].default and (parts["debug"].nodes, parts["debug"].cpus, parts["debug"].gpus) == (3, 2, 0)
    assert (parts["gpu"].nodes, parts["gpu"].cpus, parts["gpu"].memory_mb, parts["gpu"].gpus) == (6, 64, 512000, 8)
    assert gres_gpus("gpu:a100:4,gpu:v100:2") == 6 and gres_gpus("gpu:2(S:0),mps:100") == 2


class FakeRunner:
    """Records calls and answers from a table of (argv prefix -> (rc, stdout, stderr))."""

    def __init__(self, answers: dict[str, tuple[int, str, str]]) -> None:
        self.answers, self.calls = answers, []

    def __call__(self, args, **kw):
        self.calls.append(list(args))
        key = next(k for k in self.answers if " ".join(args).startswith(k))
        rc, out, err = self.answers[key]
        return subprocess.CompletedProcess(args, rc, out, err)


def test_poll_without_accounting_asks_sacct_once_then_scontrol_only():
    run = FakeRunner({"sacct -n": (1, "", "Slurm accounting storage is disabled\n"),
                      "scontrol": (0, (REC / "scontrol_end.txt").read_text(), ""),
                      "sacct -c": (0, (REC / "sacct_completion.txt").read_text(), "")})
    client = SlurmClient(runner=run, env={})
    recs = client.poll(["27", "28", "31"], arrays=["31"])
    assert {r.job for r in recs} == {"27", "28", "31"} and len(run.calls) == 2 and client.accounting is False
    client.poll(["27", "99"])  # 99 was purged: one more look in the completion log
    assert [c[:2] for c in run.calls[2:]] == [["scontrol", "-o"], ["sacct", "-c"]]


def test_poll_with_accounting_is_one_sacct_call():
    run = FakeRunner({"sacct -n": (0, SACCT_DBD, "")})
    client = SlurmClient(runner=run, env={})
    recs = client.poll(["27", "31", "40"], arrays=["31"])
    assert len(run.calls) == 1 and run.calls[0][:6] == ["sacct", "-n", "-P", "-X", "-j", "27,31,40"]
    assert {r.job for r in recs} == {"27", "31", "40"}


def test_errors_name_the_command_and_the_fix():
    run = FakeRunner({"sbatch": (1, "", "sbatch: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
                                        "sbatch: error: fetch_config: DNS SRV lookup failed\n")})
    with pytest.raises(BackendError, match="(?s)sbatch --parsable.*DNS SRV.*SLURM_CONF"):
        SlurmClient(runner=run, env={}).sbatch("#!/bin/bash\n")
    def absent(args, **kw):
        raise FileNotFoundError(args[0])

    with pytest.raises(BackendError, match="slurm-client"):
        SlurmClient(runner=absent).sinfo()
