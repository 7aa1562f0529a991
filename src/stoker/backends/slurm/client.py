"""The Slurm commands stoker runs (sbatch, sacct / scontrol, scancel, sinfo), through an injected runner.

Polling many jobs takes one call:
- with accounting (slurmdbd): `sacct -n -P -X -j ID,ID,... -o JobID,State,ExitCode,Start,NodeList,Reason`
  (finished jobs stay there; array elements come as `ID_i`, a pending rest of an array as `ID_[i-k%t]`);
- without it (`sacct` answers "accounting storage is disabled", remembered for the client's lifetime):
  `scontrol -o show job`, every job slurmctld still holds (finished ones for MinJobAge seconds), one line
  each with JobState, ExitCode, StartTime, NodeList, Reason and ArrayJobId/ArrayTaskId. Plain jobs missing
  from it (purged) are looked up once more in the job completion log, `sacct -c`, where there is one.
`squeue` cannot tell exit codes, and `scontrol show job` takes one id at a time, so neither is used per job.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from stoker.errors import BackendError

Runner = Callable[..., subprocess.CompletedProcess]
SACCT_FIELDS = "JobID,State,ExitCode,Start,NodeList,Reason"
COMPLETION_FIELDS = "JobID,State,ExitCode,NodeList,Start"
_KEY = re.compile(r"(?:^| )([A-Za-z][\w:/]*)=")

TRANSIENT = ("Resource temporarily unavailable", "Unable to contact slurm controller", "Connection refused",
             "Socket timed out on send/recv")
TRANSIENT_WAITS = (1.0, 3.0, 0.0)  # three tries in all

# (what sbatch or another command says, the fix, whether the request itself is refused: then submitting it again
# fails the same way, so the run's last line says "fix it and run again", not `resume`)
_FIXES = (
    (("DNS SRV lookup failed", "Could not establish a configuration source", "Unable to contact slurm controller",
      "Unable to contact slurmctld", "Connection refused", "Zero Bytes were transmitted"),
     "slurmctld is unreachable or SLURM_CONF is not set: set SLURM_CONF to the cluster's slurm.conf (now: {conf}) "
     "and check `scontrol ping`", False),
    (("Invalid partition name",), "the partition does not exist: pick one that `sinfo -s` lists", True),
    (("Invalid account", "Invalid qos"), "the account or QOS is not yours: see `sacctmgr show assoc user=$USER` "
     "and set @slurm(account=...) / @slurm(qos=...) to one it lists", True),
    (("Invalid feature specification",), "no node of the cluster has the feature(s) of @slurm(constraint=...): "
     "see the features each node has with `sinfo -o '%N %f'`, then fix or drop constraint=", True),
    (("Invalid node name specified",), "a node named in the request (e.g. --exclude / --nodelist in "
     "@slurm(extra=[...])) does not exist: see `sinfo -N`", True),
    (("Requested node configuration is not available", "More processors requested than permitted",
      "Memory required by task is not available", "Invalid generic resource"),
     "no node of the partition has what the step asks for: lower @slurm(...)/@resources or pick another partition",
     True),
    (("Requested time limit is invalid", "time limit", "Invalid --time specification"), "the time limit is not a "
     "Slurm time or is over the partition's MaxTime: fix @slurm(time=...) or @timeout", True),
    (("No such file or directory",), "a command or folder is missing on this host: install the Slurm client "
     "(e.g. apt-get install slurm-client) and check the log folder", False),
)


class SubmissionRefused(BackendError):
    """sbatch refused the request itself (an unknown partition, account, QOS or feature, more than any node has):
    submitting it again fails the same way, so neither a retry nor `resume` is offered."""

    permanent = True


@dataclass
class SlurmRecord:
    """One job (or array element) as Slurm reports it. `job` is the id submitted (the array's for elements)."""

    job: str
    state: str
    exit_code: str = "0:0"
    start: str = ""
    nodes: str = ""
    reason: str = ""
    index: int | None = None  # array element index
    pending: list[int] = field(default_factory=list)  # elements of an array not yet started (one record)


@dataclass
class Partition:
    name: str
    default: bool = False
    nodes: int = 0
    cpus: int = 0  # per node (the largest node)
    memory_mb: int = 0
    gpus: int = 0
    state: str = "up"
    max_time: str = "infinite"


def _indices(spec: str) -> list[int]:
    """Array index specs: `0-4`, `2,5-7`, `[0-9%2]` -> the indices (throttle dropped)."""
    out: list[int] = []
    for part in spec.strip("[]").split("%")[0].split(","):
        lo, _, hi = part.partition("-")
        if lo.strip().isdigit():
            out += range(int(lo), int(hi or lo) + 1)
    return out


def parse_sacct(text: str) -> list[SlurmRecord]:
    """`sacct -n -P -X -o JobID,State,ExitCode,Start,NodeList,Reason` (or the completion log's field order)."""
    records = []
    for line in text.splitlines():
        f = line.split("|")
        if len(f) < 5 or not f[0]:
            continue
        job, _, index = f[0].partition("_")
        job = job.split(".")[0].split("+")[0]
        rec = SlurmRecord(job=job, state=f[1].split()[0] if f[1] else "UNKNOWN", exit_code=f[2],
                          start=f[3], nodes=f[4], reason=f[5] if len(f) > 5 else "")
        if index.startswith("["):
            rec.pending = _indices(index)
        elif index.isdigit():
            rec.index = int(index)
        records.append(rec)
    return records


def parse_completion(text: str) -> list[SlurmRecord]:
    """`sacct -c -n -P -o JobID,State,ExitCode,NodeList,Start` (no Reason field in the completion log)."""
    rows = []
    for line in text.splitlines():
        f = line.split("|")
        if len(f) == 5:
            rows.append("|".join([f[0], f[1], f[2], f[4], f[3]]))
    return parse_sacct("\n".join(rows))


def scontrol_fields(line: str) -> dict[str, str]:
    """`scontrol -o show ...` line -> {key: value} (values may hold spaces, keys may hold ':' and '/')."""
    keys = list(_KEY.finditer(line))
    return {m.group(1): line[m.end():(keys[i + 1].start() if i + 1 < len(keys) else len(line))].strip()
            for i, m in enumerate(keys)}


def parse_scontrol_jobs(text: str) -> list[SlurmRecord]:
    records = []
    for line in text.splitlines():
        kv = scontrol_fields(line)
        if "JobId" not in kv:
            continue
        rec = SlurmRecord(job=kv["JobId"], state=kv.get("JobState", "UNKNOWN"), exit_code=kv.get("ExitCode", "0:0"),
                          start=kv.get("StartTime", ""), nodes=kv.get("NodeList", ""), reason=kv.get("Reason", ""))
        task = kv.get("ArrayTaskId", "")
        if kv.get("ArrayJobId") and task:
            rec.job = kv["ArrayJobId"]
            if task.isdigit():
                rec.index = int(task)
            else:
                rec.pending = _indices(task)
        records.append(rec)
    return records


def parse_sinfo(text: str) -> dict[str, Partition]:
    """`sinfo -h -o %P|%D|%c|%m|%G|%a|%l`: one line per partition and node configuration."""
    parts: dict[str, Partition] = {}
    for line in text.splitlines():
        f = line.strip().split("|")
        if len(f) < 7:
            continue
        name = f[0].rstrip("*")
        p = parts.setdefault(name, Partition(name=name, default=f[0].endswith("*"), state=f[5], max_time=f[6]))
        p.nodes += int(f[1] or 0)
        p.cpus = max(p.cpus, _leading_int(f[2]))
        p.memory_mb = max(p.memory_mb, _leading_int(f[3]))
        p.gpus = max(p.gpus, gres_gpus(f[4]))
    return parts


def _leading_int(s: str) -> int:
    m = re.match(r"\d+", s.strip())
    return int(m.group()) if m else 0


def gres_gpus(gres: str) -> int:
    """GPUs per node from a GRES string: `gpu:4`, `gpu:a100:8(S:0-1)`, `gpu:a100:4,gpu:v100:2`, `(null)`."""
    total = 0
    for item in re.split(r",(?![^(]*\))", gres):
        item = item.split("(")[0]
        if item.startswith("gpu"):
            count = item.rsplit(":", 1)[-1]
            total += int(count) if count.isdigit() else 1
    return total


class SlurmClient:
    """Runs Slurm's commands. `runner` is `subprocess.run`-like (tests inject a recording one); `env` is the
    environment of every command (default: this process's)."""

    def __init__(self, runner: Runner | None = None, env: Mapping[str, str] | None = None,
                 timeout: float = 60) -> None:
        self.runner = runner or subprocess.run
        self.env = dict(env) if env is not None else None
        self.timeout = timeout
        self.accounting: bool | None = None  # does sacct work here? (None: not asked yet)

    def _env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return {**(self.env if self.env is not None else os.environ), **(extra or {})}

    def run(self, args: list[str], *, input: str | None = None, env: Mapping[str, str] | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
        """Run one command; a failure is a BackendError naming the command, its stderr and the fix."""
        full_env = self._env(env)
        try:
            p = self.runner(args, input=input, capture_output=True, text=True, env=full_env, timeout=self.timeout)
        except FileNotFoundError:
            raise BackendError(f"`{args[0]}` is not installed here: install the Slurm client (e.g. apt-get install "
                               f"slurm-client) or put it on PATH") from None
        except subprocess.TimeoutExpired:
            raise BackendError(f"`{' '.join(args[:3])} ...` did not answer in {self.timeout:.0f} s: is slurmctld "
                               f"overloaded or unreachable? check `scontrol ping`") from None
        if check and p.returncode != 0:
            raise BackendError(self.explain(args, p.stderr or p.stdout or "", full_env))
        return p

    @staticmethod
    def explain(args: list[str], stderr: str, env: Mapping[str, str] | None = None) -> str:
        conf = (env or os.environ).get("SLURM_CONF", "not set")
        fix = next((f for needles, f, _ in _FIXES if any(n in stderr for n in needles)), "see the message above")
        return f"`{' '.join(args)}` failed: {stderr.strip()[-800:]}\nfix: {fix.format(conf=conf)}"

    @staticmethod
    def refused(stderr: str) -> bool:
        """Whether a failed sbatch refused the request itself (see _FIXES), not a passing trouble."""
        return any(refused and any(n in stderr for n in needles) for needles, _, refused in _FIXES)

    # -- submit ---------------------------------------------------------------------------------------
    def sbatch(self, script: str, env: Mapping[str, str] | None = None, args: Iterable[str] = ()) -> str:
        """Submit a script (on stdin); returns the job id. `env` is added to the job's environment by name."""
        for wait in TRANSIENT_WAITS:  # a busy or restarting controller: nothing was submitted, try again
            p = self.run(["sbatch", "--parsable", *args], input=script, env=env, check=False)
            if p.returncode == 0 or not any(t in p.stderr for t in TRANSIENT):
                break
            time.sleep(wait)
        if p.returncode != 0:
            said = p.stderr or p.stdout or ""
            error = SubmissionRefused if self.refused(said) else BackendError
            raise error(self.explain(["sbatch", "--parsable", *args], said, env))
        job = p.stdout.strip().splitlines()[-1].split(";")[0] if p.stdout.strip() else ""
        if not job.isdigit():
            raise BackendError(f"sbatch printed no job id: {p.stdout!r} {p.stderr!r}")
        return job

    # -- poll -----------------------------------------------------------------------------------------
    def poll(self, job_ids: list[str], arrays: Iterable[str] = ()) -> list[SlurmRecord]:
        """Records of every job (and array element) of `job_ids`, in one call (two when a fallback is needed).
        Jobs Slurm does not know (yet, or any more) are absent."""
        if not job_ids:
            return []
        wanted = set(job_ids)
        if self.accounting is not False:
            p = self.run(["sacct", "-n", "-P", "-X", "-j", ",".join(job_ids), "-o", SACCT_FIELDS], check=False)
            if p.returncode == 0 and "accounting storage is disabled" not in p.stderr + p.stdout:
                self.accounting = True
                return [r for r in parse_sacct(p.stdout) if r.job in wanted]
            if "accounting storage is disabled" in p.stderr + p.stdout:
                self.accounting = False
            # else slurmdbd is down right now: ask slurmctld this time
        p = self.run(["scontrol", "-o", "show", "job"], check=False)
        if p.returncode != 0 and "No jobs in the system" not in p.stdout + p.stderr:
            raise BackendError(self.explain(["scontrol", "-o", "show", "job"], p.stderr or p.stdout))
        records = [r for r in parse_scontrol_jobs(p.stdout) if r.job in wanted]
        missing = sorted(wanted - {r.job for r in records} - set(arrays))
        if missing:  # purged after MinJobAge: the completion log may still have them (no array indices there)
            c = self.run(["sacct", "-c", "-n", "-P", "-j", ",".join(missing), "-o", COMPLETION_FIELDS], check=False)
            if c.returncode == 0:
                records += [r for r in parse_completion(c.stdout) if r.job in set(missing)]
        return records

    def steps(self, job_id: str) -> list[str] | None:
        """The job's running member steps (`JOB.0` ...; not its batch or extern step), None when Slurm did not say."""
        p = self.run(["squeue", "-h", "-s", "-j", str(job_id), "-o", "%i"], check=False)
        if p.returncode != 0:
            return None
        return [s for s in p.stdout.split() if s.startswith(f"{job_id}.") and s.split(".", 1)[1].isdigit()]

    # -- cancel ---------------------------------------------------------------------------------------
    def scancel(self, job_id: str, signal: str | None = None) -> bool:
        """With `signal`: signal the steps of a *running* job (its members; `--state=RUNNING`, because Slurm
        22.05 ends a pending job that is signalled as COMPLETED with exit code 0). Without: cancel the job (TERM
        now, KILL after the cluster's KillWait). False when the job is already over."""
        args = ["scancel", *([f"--signal={signal}", "--state=RUNNING"] if signal else []), str(job_id)]
        p = self.run(args, check=False)
        if p.returncode == 0 and "error" not in p.stderr.lower():
            return True
        if any(g in p.stderr for g in ("already completing or completed", "Invalid job id")):
            return False
        if signal and not (p.stderr or p.stdout).strip():
            return False  # `--state=RUNNING` matched nothing, silently: the job is no longer running (its run
            # process, interrupted first by `stoker kill`, cancelled it a moment ago)
        raise BackendError(self.explain(args, p.stderr or p.stdout))

    # -- cluster --------------------------------------------------------------------------------------
    def sinfo(self) -> dict[str, Partition]:
        """Partitions: node count, the largest node's CPUs, memory (MB) and GPUs, state, MaxTime."""
        p = self.run(["sinfo", "-h", "-o", "%P|%D|%c|%m|%G|%a|%l"])
        return parse_sinfo(p.stdout)
