"""`@slurm(...)`: run a step on a Slurm cluster (`--with slurm:partition=x` does the same from the CLI).

Only settings are recorded and checked here; the backend renders them into an sbatch script. Resources not
given here are taken from the step's `@resources` (cpu, memory in MB, gpu), so the same flow runs locally.
Import-light on purpose: `stoker` imports this module.
"""

from __future__ import annotations

import re
from typing import Any

from stoker.errors import ConfigError
from stoker.flow.decorators import StepDecorator, make_step_decorator

_MEM = re.compile(r"^(\d+)([KMGT]?)B?$", re.IGNORECASE)
_TIME = re.compile(r"^(?:(\d+)-(\d{1,2})(?::(\d{1,2}))?(?::(\d{1,2}))?|(\d+)(?::(\d{1,2}))?(?::(\d{1,2}))?)$")
_MB_PER_UNIT = {"K": 1 / 1024, "M": 1, "": 1, "G": 1024, "T": 1024 * 1024}


def mem_to_mb(mem: str | int) -> float:
    """Slurm's --mem value ("4G", "4000", "512M", 4000) in MB (a plain number means MB, as in Slurm)."""
    m = _MEM.match(str(mem).strip())
    if not m:
        raise ValueError(mem)
    return int(m.group(1)) * _MB_PER_UNIT[m.group(2).upper()]


def time_to_minutes(value: str | int) -> float:
    """Slurm's --time forms (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) in minutes."""
    if isinstance(value, int):
        return float(value)
    m = _TIME.match(str(value).strip())
    if not m:
        raise ValueError(value)
    d, dh, dm, ds, a, b, c = (int(x) if x else 0 for x in m.groups())
    if m.group(1):  # D-HH[:MM[:SS]]
        return d * 1440 + dh * 60 + dm + ds / 60
    if m.group(7):  # HH:MM:SS
        return a * 60 + b + c / 60
    if m.group(6):  # MM:SS
        return a + b / 60
    return float(a)  # minutes


class SlurmDecorator(StepDecorator):
    """Run this step on Slurm: one sbatch job per task (a gang is one `--nodes=N` job).

    partition, account, qos, constraint: as in sbatch (None: the cluster's defaults).
    nodes: the gang size when given (it must match `num_parallel`); 1 for a plain task.
    gpus_per_node (int or "type:count"), cpus_per_task (int), mem ("4G", "4000" or an int in MB, per node),
    time (minutes as an int, or "MM:SS", "HH:MM:SS", "D-HH:MM:SS"; default: the step's @timeout plus a margin),
    exclusive (whole nodes), extra (more sbatch options, e.g. ["--reservation=big"]).
    """

    name = "slurm"
    engine = "slurm"
    defaults: dict[str, Any] = {"partition": None, "nodes": None, "gpus_per_node": None, "cpus_per_task": None,
                                "mem": None, "time": None, "account": None, "qos": None, "constraint": None,
                                "exclusive": False, "extra": None}

    def validate(self) -> None:
        a = self.attributes
        for key in ("partition", "account", "qos", "constraint"):
            if a[key] is not None and (not isinstance(a[key], str) or not a[key].strip() or " " in a[key]):
                raise ConfigError(f"@slurm({key}={a[key]!r}): must be a non-empty name without spaces, "
                                  f"e.g. @slurm({key}='gpu')")
        for key, least in (("nodes", 1), ("cpus_per_task", 1)):
            if a[key] is not None:
                a[key] = self._whole(key, a[key], least)
        self._gpus()
        if a["mem"] is not None:
            try:
                mb = mem_to_mb(a["mem"])
            except ValueError:
                raise ConfigError(f"@slurm(mem={a['mem']!r}): use megabytes as an int (4000) or a string with a "
                                  f"unit, e.g. mem='4000', mem='16G' (per node)") from None
            if mb <= 0 or isinstance(a["mem"], bool):
                raise ConfigError(f"@slurm(mem={a['mem']!r}): must be more than 0, e.g. mem='16G'")
            a["mem"] = str(a["mem"]).strip().upper().removesuffix("B")
        if a["time"] is not None:
            self._time()
        if not isinstance(a["exclusive"], bool):
            raise ConfigError(f"@slurm(exclusive={a['exclusive']!r}): must be True or False")
        extra = a["extra"] or []
        if isinstance(extra, str):
            extra = [extra]
        if not isinstance(extra, (list, tuple)) or not all(isinstance(x, str) and x.startswith("-") for x in extra):
            raise ConfigError(f"@slurm(extra={a['extra']!r}): must be a list of sbatch options, "
                              f"e.g. extra=['--reservation=big', '--mail-type=END']")
        a["extra"] = list(extra)

    def _whole(self, key: str, v: Any, least: int) -> int:
        if isinstance(v, bool) or not isinstance(v, (int, str)) or not str(v).strip().isdigit() or int(v) < least:
            raise ConfigError(f"@slurm({key}={v!r}): must be a whole number of at least {least}, e.g. {key}=2")
        return int(v)

    def _gpus(self) -> None:
        v = self.attributes["gpus_per_node"]
        if v is None:
            return
        kind, _, count = str(v).rpartition(":")
        if isinstance(v, bool) or not count.isdigit() or (kind and not re.fullmatch(r"[\w.-]+", kind)):
            raise ConfigError(f"@slurm(gpus_per_node={v!r}): must be a count or 'type:count', "
                              f"e.g. gpus_per_node=8 or gpus_per_node='a100:8'")
        self.attributes["gpus_per_node"] = int(v) if not kind else f"{kind}:{int(count)}"

    def _time(self) -> None:
        v = self.attributes["time"]
        fix = "use minutes as an int (90) or 'HH:MM:SS' / 'D-HH:MM:SS' / 'MM:SS', e.g. time='02:00:00'"
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            raise ConfigError(f"@slurm(time={v!r}): {fix}")
        if isinstance(v, str) and v.strip().lower() in ("infinite", "unlimited"):
            self.attributes["time"] = "UNLIMITED"
            return
        try:
            minutes = time_to_minutes(int(v) if isinstance(v, str) and v.strip().isdigit() else v)
        except ValueError:
            raise ConfigError(f"@slurm(time={v!r}): {fix}") from None
        if minutes <= 0:
            raise ConfigError(f"@slurm(time={v!r}): must be more than 0; {fix}")
        self.attributes["time"] = str(v).strip()


slurm = make_step_decorator(SlurmDecorator)  # registered for --with slurm:...
