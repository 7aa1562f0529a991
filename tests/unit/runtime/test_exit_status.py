"""The exit codes a torchrun worker reports beside torchrun (which exits 1 whatever they were), and what the
scheduler makes of a task's exit code and manifest."""

from __future__ import annotations

import pytest

from stoker.errors import EXIT_PERMANENT, EXIT_PREEMPTED, ConfigError, Preempted, StokerError
from stoker.exitstatus import ENV, exit_code_for, raise_for_statuses, write_status
from stoker.runtime.driver.failures import PERMANENT, PREEMPTED, failure_kind, kill_grace


def test_exit_codes_of_exceptions():
    assert exit_code_for(Preempted("x", step=3)) == EXIT_PREEMPTED == 75
    assert exit_code_for(ConfigError("x")) == EXIT_PERMANENT == 78
    assert exit_code_for(StokerError("x")) == 1 and exit_code_for(RuntimeError()) == 1
    assert exit_code_for(SystemExit(75)) == 75


def test_a_permanent_error_on_any_rank_wins_over_a_preemption(tmp_path):
    env = {ENV: str(tmp_path), "RANK": "1"}
    write_status(EXIT_PREEMPTED, Preempted("stopped", step=4), env={**env, "RANK": "0"})
    write_status(EXIT_PERMANENT, ConfigError("train.stepz is not a setting"), env=env)
    with pytest.raises(ConfigError, match="rank 1: train.stepz is not a setting") as info:
        raise_for_statuses(tmp_path, StokerError("torchrun exited with code 1"))
    assert info.value.permanent


def test_preempted_ranks_give_their_step_and_nothing_written_gives_the_fallback(tmp_path):
    for rank in ("0", "1"):
        write_status(EXIT_PREEMPTED, Preempted("stopped", step=7), env={ENV: str(tmp_path), "RANK": rank})
    write_status(1, StokerError("ordinary"), env={ENV: str(tmp_path / "none"), "RANK": "0"})  # not recorded
    with pytest.raises(Preempted) as info:
        raise_for_statuses(tmp_path, StokerError("fallback"))
    assert info.value.step == 7
    (tmp_path / "empty").mkdir()
    with pytest.raises(StokerError, match="fallback"):
        raise_for_statuses(tmp_path / "empty", StokerError("fallback"))


def test_failure_kinds_and_grace():
    assert failure_kind({"exception": {"permanent": True}}, 1) == PERMANENT
    assert failure_kind(None, 78) == PERMANENT
    assert failure_kind({"exception": {"preempted": True}}, 0) == PREEMPTED and failure_kind(None, 75) == PREEMPTED
    assert failure_kind({"exception": {"type": "RuntimeError"}}, 1) is None
    assert kill_grace({}) == 30.0 and kill_grace({"STOKER_KILL_GRACE": "5"}) == 5.0
