"""Failure attribution on the local backend (issue 25): injected faults, each attributed to its cause in the attempt's
manifest, in the run's failure line and in `stoker show`; deterministic causes are not retried, infrastructure ones
and different failures are."""

from __future__ import annotations

import subprocess
import sys

from stoker import Flow
from tests.helpers import run_flow


def _run(tmp_path, mode: str, *args: str, ok: bool = False):
    p = run_flow("causes_flow.py", "run", "--mode", mode, *args, cwd=tmp_path, check=False)
    assert (p.returncode == 0) == ok, p.stdout + p.stderr
    run = Flow("CausesFlow").latest_run
    return p.stdout + p.stderr, run, run["work"].task


def _causes(task) -> list[tuple[str, str]]:
    return [(a.exception.cause, a.exception.evidence) for a in task.attempts if not a.successful]


def test_a_killed_task_is_an_infrastructure_failure_and_is_retried(tmp_path):
    out, run, work = _run(tmp_path, "kill", "--fail_on", "0", ok=True)
    [(cause, evidence)] = _causes(work)
    assert cause == "node" and "killed by SIGKILL from outside stoker" in evidence, evidence
    assert "node lost / engine failure); retry 1 of 2" in out, out
    shown = subprocess.run([sys.executable, "-m", "stoker.cli.main", "show", f"CausesFlow/{run.id}"],
                           capture_output=True, text=True, cwd=tmp_path).stdout
    assert "attempt 0 failed: node lost / engine failure: killed by SIGKILL" in " ".join(shown.split()), shown


def test_an_oom_that_repeats_identically_is_not_retried_again(tmp_path):
    out, _, work = _run(tmp_path, "oom")
    causes = _causes(work)
    assert [c for c, _ in causes] == ["oom", "oom"], causes  # two attempts of @retry(times=2)'s three
    assert "CUDA out of memory" in causes[0][1]
    assert "cause: out of memory (log: torch.OutOfMemoryError: CUDA out of memory" in out, out
    assert "not retried: out of memory repeated identically on attempt 1" in out
    assert "fix the error above and run again" in out


def test_a_config_error_is_not_retried_even_with_retry(tmp_path):
    out, _, work = _run(tmp_path, "config")
    assert _causes(work) == [("config", "ConfigError: train.stepz is not a setting; did you mean train.steps?")]
    assert "not retried: configuration error is deterministic: running it again fails the same way; fix it and " \
           "run again" in out, out


def test_a_user_error_is_retried_until_it_repeats_identically(tmp_path):
    out, _, work = _run(tmp_path, "user")
    assert [c for c, _ in _causes(work)] == ["user", "user"]
    assert "retry 1 of 2" in out and "retry 2 of 2" not in out
    assert "not retried: user code error repeated identically on attempt 1" in out, out
    out, _, work = _run(tmp_path, "flaky")  # a different failure each time: every retry runs
    assert [c for c, _ in _causes(work)] == ["user"] * 3 and "retry 2 of 2" in out


def test_a_time_limit_is_attributed_and_retried(tmp_path):
    out, _, work = _run(tmp_path, "timeout", "--fail_on", "0", ok=True)
    [(cause, evidence)] = _causes(work)
    assert cause == "time_limit" and "timed out after 3 s" in evidence, evidence
    assert "time limit); retry 1 of 2" in out


def test_a_preemption_is_attributed(tmp_path):
    run_flow("preempt_flow.py", "run", "--mode", "preempt", "--scratch", str(tmp_path), cwd=tmp_path)
    work = Flow("PreemptFlow").latest_run["work"].task
    [(cause, evidence)] = _causes(work)
    assert cause == "preemption" and "at step 3" in evidence, evidence


def test_a_rank_killed_in_a_gang_is_the_gangs_cause(tmp_path):
    """Node 1 of a local gang is killed by SIGKILL: its attempt is a node lost / engine failure, the other node's
    attempt (stopped with the gang) says so, and the gang is retried."""
    p = run_flow("gang_flow.py", "run", "--nodes", "2", "--fail-node", "1", "--how", "kill", cwd=tmp_path)
    assert "failed (TaskDied: task process killed by signal SIGKILL; node lost / engine failure); the gang retry 1" \
        in p.stdout, p.stdout
    run = Flow("GangFlow").latest_run
    causes = {t.data.node: _causes(t) for t in run["work"]}
    [(killed, evidence)] = causes[1]
    assert killed == "node" and "killed by SIGKILL from outside stoker" in evidence
    [(peer, peer_evidence)] = causes[0]
    assert peer == "node" and peer_evidence.startswith("stopped with its gang: node 1 failed: killed by SIGKILL")
