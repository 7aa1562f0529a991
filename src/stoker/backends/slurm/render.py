"""sbatch scripts for units: pure functions of (unit, options), so `--dry-run` and golden files show exactly
what is submitted.

One unit is one job. A "task" is a 1-node job; a "gang" of N is `--nodes=N` where `srun` starts one member
per node and ends the whole step when one member fails (`--kill-on-bad-exit`); an "array" is `--array=0-K`,
one member per element. The batch script `exec`s srun so the job's exit code is srun's.

A gang with k hot spares (`@torchrun(spares=k)`, distributed/gangboard.py) is one job of N + k members that keeps
its allocation through a node failure: `#SBATCH --no-kill` and `srun --no-kill`, without `--kill-on-bad-exit`.
What Slurm then does (22.05, measured on the test cluster): when slurmctld sets a node DOWN (SlurmdTimeout after its
slurmd stopped answering), it removes the node from the job ("Removing failed node"), kills the step's tasks there
only, and leaves the job and the step running on the other nodes; the job's NodeList shrinks and srun's exit code
stays 0 (`srun: error: Node failure on nK`). Without --no-kill on the step, srun would end the whole step; without
it on the job, Slurm would end the job (NODE_FAIL). The node agents, not srun, recover: a spare takes the lost
node's slot. The exception is the batch host (the first node, member 0): its loss kills the batch script and srun,
and the job then never ends by itself, so member 0 is the gang's last spare (SlurmBackend.main_node_spare) and the
backend cancels such a job once its step is over (backend.py). Each member learns its own address from
`STOKER_NODE_ADDRS` (`node=NodeAddr,...` of the whole allocation, one scontrol call; node.py): a spare that takes
node 0's slot hosts the next rendezvous there. Such a job outlives its members (a spare waits until the gang is
over).

Every gang member leaves its exit code in `<job>-<member>.exit` in the log folder (`STOKER_SLURM_EXITS`): the job's
own code is srun's, one for all nodes, and when one node dies `--kill-on-bad-exit` TERMinates the others, so only
these files tell the node that died (say by SIGKILL) from those srun stopped; the driver blames the first's host.

No environment value is ever written into a script: the job inherits sbatch's environment by name
(`--export=ALL`), and members read their identity from Slurm's own variables (see backends/slurm/node.py).

Log files of a unit live in one folder (`log_folder`): `<job>-<member>.out|.err` per node or array element
(srun writes them on the node: the folder must be on a filesystem the nodes share) and
`batch-<job>[-<element>].out|.err` for Slurm's own messages (time limit, cancellation, srun errors).
"""

from __future__ import annotations

import math
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from typing import Any

from stoker.runtime.contract import Unit

TIME_MARGIN_MIN = 5  # a @timeout is enforced by the scheduler; Slurm's own limit is the backstop behind it
# With a time limit, Slurm TERMs every member this many seconds before it (`--signal=TERM@S`): training finishes its
# step, commits a checkpoint and exits "preempted" (75), and the scheduler resubmits it to resume. A later
# `--signal` in @slurm(extra=[...]) overrides it.
SIGNAL_LEAD_S = 120


@dataclass(kw_only=True)
class SlurmOptions:
    """How the Slurm backend submits (per backend instance; per-step settings come from @slurm).

    python: the interpreter members run on the nodes (`$STOKER_SLURM_PYTHON`, default: this one; it must exist
        there too).
    log_dir: root of the per-unit log folders, on a filesystem the nodes share (`$STOKER_SLURM_LOG_DIR`, default
        `$STOKER_HOME/slurm`).
    array_throttle: at most this many elements of an array run at once (`--array=0-K%T`).
    poll_interval: the least seconds between two sacct/scontrol calls (`$STOKER_SLURM_POLL_INTERVAL`, default 1).
    sbatch_args: extra sbatch options for every job (e.g. ["--reservation=x"]).
    """

    python: str = field(default_factory=lambda: os.environ.get("STOKER_SLURM_PYTHON") or sys.executable)
    log_dir: str = field(default_factory=lambda: os.environ.get("STOKER_SLURM_LOG_DIR", ""))
    array_throttle: int | None = None
    poll_interval: float = field(default_factory=lambda: float(os.environ.get("STOKER_SLURM_POLL_INTERVAL", "1")))
    sbatch_args: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.log_dir:
            from stoker.store.paths import home_dir

            self.log_dir = str(home_dir() / "slurm")
        self.log_dir = os.path.abspath(os.path.expanduser(self.log_dir))
        if self.array_throttle is not None and int(self.array_throttle) < 1:
            from stoker.errors import ConfigError

            raise ConfigError(f"SlurmOptions(array_throttle={self.array_throttle}): must be at least 1 (or None)")
        if self.poll_interval <= 0:
            from stoker.errors import ConfigError

            raise ConfigError(f"SlurmOptions(poll_interval={self.poll_interval}): must be more than 0 seconds")


def _safe(name: str) -> str:
    return re.sub(r"[^\w.-]", "_", str(name))


def log_folder(unit: Unit, opts: SlurmOptions) -> str:
    """`<log_dir>/<flow>/<run>/<step>-<first task id>-<attempt>`: unique per unit attempt."""
    return os.path.join(opts.log_dir, _safe(unit.flow), _safe(unit.run_id),
                        f"{_safe(unit.step)}-{_safe(unit.specs[0].task_id)}-{unit.attempt}")


def member_log(folder: str, job_id: str, member: int, stream: str) -> str:
    """The file srun writes member `member`'s stream to (what `%j-%n` / `%A-%a` expand to)."""
    return os.path.join(folder, f"{job_id}-{member}.{'err' if stream == 'stderr' else 'out'}")


def member_exit(folder: str, job_id: str, member: int) -> str:
    """The exit code a member of a gang with spares leaves when it ends (backends/slurm/node.py)."""
    return os.path.join(folder, f"{job_id}-{member}.exit")


def batch_log(folder: str, job_id: str, member: int, kind: str, stream: str) -> str | None:
    """Slurm's own messages for a member: the batch script's file (member 0 of a job, each array element)."""
    ext = "err" if stream == "stderr" else "out"
    if kind == "array":
        return os.path.join(folder, f"batch-{job_id}-{member}.{ext}")
    return os.path.join(folder, f"batch-{job_id}.{ext}") if member == 0 else None


def effective_options(unit: Unit) -> dict[str, Any]:
    """@slurm settings, with cpus / memory / gpus filled from @resources where @slurm leaves them out."""
    o = {k: v for k, v in (unit.options or {}).items() if v not in (None, False, [], "")}
    res = unit.resources or {}
    if "cpus_per_task" not in o and res.get("cpu"):
        o["cpus_per_task"] = math.ceil(float(res["cpu"]))
    if "mem" not in o and res.get("memory"):
        o["mem"] = str(math.ceil(float(res["memory"])))  # @resources(memory=) is in MB, as is a bare --mem
    if "gpus_per_node" not in o and res.get("gpu"):
        o["gpus_per_node"] = math.ceil(float(res["gpu"]))
    if "time" not in o and unit.timeout_s:
        o["time"] = math.ceil(unit.timeout_s / 60) + TIME_MARGIN_MIN
    return o


def render_sbatch(unit: Unit, opts: SlurmOptions) -> str:
    """The sbatch script of `unit` (deterministic: the same unit and options give the same text)."""
    if unit.kind not in ("task", "gang", "array"):
        raise ValueError(f"unknown unit kind {unit.kind!r}")
    o = effective_options(unit)
    folder = log_folder(unit, opts)
    n = unit.size
    array = unit.kind == "array"
    gang = unit.kind == "gang"
    spares = gang and unit.spares > 0
    if spares:
        n = unit.nodes  # members: the gang's nodes and its spares
    job, member = ("%A", "%a") if array else ("%j", "%n")
    head = [f"--job-name=stoker.{_safe(unit.flow)}.{_safe(unit.step)}"]
    if array:
        limit = unit.throttle or opts.array_throttle
        throttle = f"%{limit}" if limit else ""
        head += [f"--array=0-{n - 1}{throttle}", "--nodes=1", "--ntasks=1"]
    elif gang:
        head += [f"--nodes={n}", "--ntasks-per-node=1", *(["--no-kill"] if spares else [])]
    else:
        head += ["--nodes=1", "--ntasks=1"]
    for key, flag in (("partition", "partition"), ("account", "account"), ("qos", "qos"),
                      ("constraint", "constraint"), ("cpus_per_task", "cpus-per-task"), ("mem", "mem"),
                      ("gpus_per_node", "gpus-per-node"), ("time", "time")):
        if key in o:
            head.append(f"--{flag}={o[key]}")
    if "time" in o:
        head.append(f"--signal=TERM@{SIGNAL_LEAD_S}")
    if o.get("exclusive"):
        head.append("--exclusive")
    if unit.exclude_hosts:  # hosts that failed this run twice (stoker.runtime.driver.attribution)
        head.append(f"--exclude={','.join(unit.exclude_hosts)}")
    head += [f"--chdir={folder}",
             f"--output={folder}/batch-{job}{'-%a' if array else ''}.out",
             f"--error={folder}/batch-{job}{'-%a' if array else ''}.err",
             "--open-mode=append", "--no-requeue", "--export=ALL",
             *opts.sbatch_args, *o.get("extra", [])]
    # with spares a lost node must end neither the job nor the step (see the module docstring)
    srun = ["srun", *(["--no-kill"] if spares else ["--kill-on-bad-exit=1"] if gang else []),
            f"--nodes={n if gang else 1}", f"--ntasks={n if gang else 1}", "--ntasks-per-node=1",
            *([f"--cpus-per-task={o['cpus_per_task']}"] if "cpus_per_task" in o else []),
            "--open-mode=append", f"--output={folder}/{job}-{member}.out", f"--error={folder}/{job}-{member}.err"]
    kind = f"a gang of {len(unit.specs)} nodes and {unit.spares} spare{'s' if unit.spares > 1 else ''}" if spares \
        else f"a gang of {n} nodes" if gang else f"an array of {n}" if array else "one task"
    lines = ["#!/bin/bash",
             f"# stoker: {unit.label} ({kind}); rendered by stoker.backends.slurm, do not edit",
             *(f"#SBATCH {h}" for h in head),
             "",
             "# Identity comes from Slurm's environment (SLURM_NODEID / SLURM_ARRAY_TASK_ID), not from the submitter.",
             "unset STOKER_MEMBER STOKER_NUM_NODES STOKER_MAIN_ADDR STOKER_MAIN_PORT"]
    if gang:
        lines += ["# Rendezvous on the first node's address (NodeAddr, else its host name).",
                  'first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
                  "addr=$(scontrol -o show node \"$first\" 2>/dev/null | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)",
                  'export STOKER_MAIN_ADDR="${addr:-$first}"']
    if spares:
        lines += ["# Every member's own address (its NodeAddr), as node=addr,...: a spare that takes node 0's place",
                  "# hosts the next rendezvous there (stoker.backends.slurm.node reads it by SLURMD_NODENAME).",
                  "unset STOKER_NODE_ADDR",
                  "addrs=$(scontrol -o show node \"$SLURM_JOB_NODELIST\" 2>/dev/null | "
                  "sed -n 's/^NodeName=\\([^ ]*\\) .*NodeAddr=\\([^ ]*\\).*/\\1=\\2/p' | paste -sd, -)",
                  'export STOKER_NODE_ADDRS="$addrs"']
    if gang:
        lines += ["# Each member's exit code goes to <job>-<member>.exit here: the job's own code is srun's, one for",
                  "# every node (and a job with spares outlives its members).",
                  f"export STOKER_SLURM_EXITS={shlex.quote(folder)}"]
    node = unit.node_command(opts.python, "stoker.backends.slurm.node")  # reads Slurm's variables
    lines += ["exec " + shlex.join(srun) + " \\", "    " + shlex.join(node), ""]
    return "\n".join(lines)
