"""Issue 25: sbatch's refusals of the request itself (what sbatch 22.05 printed on the localhost test cluster) get the
fix and are permanent (the run's last line then says "fix it and run again", not `resume`); a controller that cannot
be reached is not."""

from __future__ import annotations

import subprocess

import pytest

from stoker.backends.slurm.client import SlurmClient, SubmissionRefused
from stoker.errors import BackendError

REFUSED = {  # recorded: `sbatch --parsable <flag> --wrap true` on the 3-node test cluster
    "--constraint=gpu80": ("sbatch: error: Batch job submission failed: Invalid feature specification\n",
                           "sinfo -o '%N %f'"),
    "--partition=nope": ("sbatch: error: invalid partition specified: nope\n"
                         "sbatch: error: Batch job submission failed: Invalid partition name specified\n", "sinfo -s"),
    "--mem=999999": ("sbatch: error: Memory specification can not be satisfied\nsbatch: error: Batch job submission "
                     "failed: Requested node configuration is not available\n", "lower @slurm"),
    "--exclude=n9": ("sbatch: error: Batch job submission failed: Invalid node name specified\n", "sinfo -N"),
    "--time=bogus": ("sbatch: error: Invalid --time specification\n", "@slurm(time=...)"),
    # account and QOS are enforced only with slurmdbd (not on the test cluster): Slurm's own words
    "--account=nobody": ("sbatch: error: Batch job submission failed: Invalid account or account/partition "
                         "combination specified\n", "sacctmgr show assoc"),
    "--qos=nope": ("sbatch: error: Batch job submission failed: Invalid qos specification\n", "sacctmgr show assoc"),
}


def _client(code: int, stderr: str) -> SlurmClient:
    return SlurmClient(runner=lambda args, **kw: subprocess.CompletedProcess(args, code, "", stderr), env={})


@pytest.mark.parametrize("flag", sorted(REFUSED))
def test_a_refused_request_is_permanent_with_its_fix(flag):
    stderr, fix = REFUSED[flag]
    with pytest.raises(SubmissionRefused) as e:
        _client(1, stderr).sbatch("#!/bin/bash\n")
    assert e.value.permanent and fix in str(e.value) and "\nfix: " in str(e.value)


def test_an_unreachable_controller_is_not_permanent(monkeypatch):
    import stoker.backends.slurm.client as client

    monkeypatch.setattr(client, "TRANSIENT_WAITS", (0.0, 0.0, 0.0))
    with pytest.raises(BackendError) as e:
        _client(1, "sbatch: error: Unable to contact slurm controller (connect failure)\n").sbatch("#!/bin/bash\n")
    assert not isinstance(e.value, SubmissionRefused) and not e.value.permanent and "scontrol ping" in str(e.value)
