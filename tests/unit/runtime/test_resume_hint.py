"""The hint a failed run prints repeats the options it ran with (issue 25: following `resume RUN` without
`--backend slurm` trained the gang on the login node)."""

from __future__ import annotations

import shlex

from stoker.runtime.driver.launch import resume_command
from tests.helpers import run_flow


def test_resume_command_repeats_backend_and_with(tmp_path):
    cmd = resume_command(str(tmp_path / "f.py"), "17", ["--backend=slurm", "--with=slurm:partition=a b"])
    assert shlex.split(cmd)[2:] == ["resume", "--backend=slurm", "--with=slurm:partition=a b", "17"]


def test_a_failed_run_hints_resume_with_its_options(tmp_path):
    env = {"STOKER_HOME": str(tmp_path / "home"), "RESUME_OK": ""}
    p = run_flow("resume_flow.py", "run", "--with", "retry:times=0", cwd=tmp_path, env=env, check=False)
    assert p.returncode != 0
    assert "resume --with=retry:times=0 " in p.stdout + p.stderr, p.stdout + p.stderr
