"""Checkpoint interval advice: the interval between checkpoints that minimises the expected lost time (Young/Daly),
from the blocking time of a save (delta) and the mean time between failures of the job (M).

Saving often costs delta per save; saving seldom costs, on each failure, the work since the last save. Young (1974)
found the optimum at ``tau = sqrt(2 delta M)``; Daly (2006) refined it for save times that are not small against M::

    tau = sqrt(2 delta M) * [1 + (1/3) sqrt(delta / (2M)) + (1/9) (delta / (2M))] - delta     for delta < 2M
    tau = M                                                                                   otherwise

``tau`` is the training time between saves (the save itself not counted); in steps it is ``tau / mean step time``,
rounded, at least 1. The expected share of the time lost (saves, and half an interval recomputed per failure) is,
to first order, ``delta / (tau + delta) + (tau + delta) / (2M)``: :func:`expected_loss` gives it for the advised and
the configured interval.

M is the job's: one node's MTBF divided by the number of nodes (a gang fails when any node does). Where it comes
from, in order: the trainer's ``checkpoint.mtbf_hours``, else ``$STOKER_MTBF_HOURS``, else :data:`NODE_MTBF_HOURS`
per node (:func:`given_mtbf`); the goodput ledger (stoker.client.goodput) prefers the failures it observed.

Both the trainer (``checkpoint.every = "auto"``, stoker.train.interval) and the goodput ledger's readers use this
module; it sits in the store layer, the lowest one both import (as stoker.store.goodput does), and does no I/O.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from stoker.errors import ConfigError

ENV_MTBF = "STOKER_MTBF_HOURS"  # one node's MTBF in hours, given by the user
NODE_MTBF_HOURS = 24.0  # the assumed MTBF of one node when none is given or observed (a large GPU node's order)
# failed attempts' causes (stoker.runtime.driver.causes) that say nothing of the hardware's failure rate: a
# deterministic error or a cancel ends the run, a preemption checkpoints first and loses no work
NOT_FAILURES = ("config", "stoker", "cancelled", "preemption")


def young(save_s: float, mtbf_s: float) -> float:
    """Young's interval: sqrt(2 delta M) seconds of training between saves."""
    _check(save_s, mtbf_s)
    return math.sqrt(2.0 * save_s * mtbf_s)


def daly(save_s: float, mtbf_s: float) -> float:
    """Daly's interval (his higher-order estimate): seconds of training between saves; M itself once delta >= 2M."""
    _check(save_s, mtbf_s)
    if save_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = save_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * save_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - save_s


def expected_loss(interval_s: float, save_s: float, mtbf_s: float) -> float:
    """The expected share of the time lost to saves and recomputation with saves every ``interval_s`` seconds of
    training (first order: delta / (tau + delta) + (tau + delta) / 2M)."""
    _check(save_s, mtbf_s)
    period = interval_s + save_s
    return save_s / period + period / (2.0 * mtbf_s) if period > 0 else 1.0


def steps_for(interval_s: float, step_s: float) -> int:
    """An interval in seconds as steps of ``step_s`` seconds: rounded, at least 1."""
    if not step_s > 0:
        raise ValueError(f"the mean step time must be > 0, got {step_s!r}")
    return max(1, int(round(interval_s / step_s)))


def _check(save_s: float, mtbf_s: float) -> None:
    if not (math.isfinite(save_s) and save_s >= 0):
        raise ValueError(f"the save time must be a finite number >= 0, got {save_s!r}")
    if not (math.isfinite(mtbf_s) and mtbf_s > 0):
        raise ValueError(f"the MTBF must be a finite number > 0, got {mtbf_s!r}")


def given_mtbf(setting_hours: float = 0.0, nodes: int = 1, env: Mapping[str, str] | None = None
               ) -> tuple[float, str, str]:
    """(the job's MTBF in seconds, where it comes from: "setting" / "env" / "assumed", the words for it) from the
    setting ``checkpoint.mtbf_hours`` (> 0), else ``$STOKER_MTBF_HOURS``, else NODE_MTBF_HOURS; each is one node's
    MTBF, divided by ``nodes``."""
    if setting_hours and setting_hours > 0:
        return job_mtbf(setting_hours, nodes, "setting")
    hours = env_mtbf_hours(env)
    return job_mtbf(hours, nodes, "env") if hours is not None else job_mtbf(NODE_MTBF_HOURS, nodes, "assumed")


def job_mtbf(node_hours: float, nodes: int, source: str) -> tuple[float, str, str]:
    """(the MTBF of a job of ``nodes`` nodes in seconds: one node's over the number of nodes, ``source``, its words)."""
    nodes = max(1, int(nodes))
    per = f" per node / {nodes} nodes" if nodes > 1 else ""
    words = {"setting": f"given (checkpoint.mtbf_hours={node_hours:g} h{per})",
             "env": f"given (${ENV_MTBF}={node_hours:g} h{per})",
             "assumed": f"assumed ({node_hours:g} h{per or ' per node'})"}[source]
    return node_hours * 3600.0 / nodes, source, words


def env_mtbf_hours(env: Mapping[str, str] | None = None) -> float | None:
    """``$STOKER_MTBF_HOURS`` (one node's MTBF in hours), or None when unset; a ConfigError when not a number > 0."""
    text = (os.environ if env is None else env).get(ENV_MTBF, "").strip()
    if not text:
        return None
    try:
        hours = float(text)
    except ValueError:
        hours = float("nan")
    if not (math.isfinite(hours) and hours > 0):
        raise ConfigError(f"{ENV_MTBF}={text!r}: give one node's mean time between failures in hours (> 0), "
                          "e.g. 24")
    return hours


def advise(save_s: float, step_s: float, mtbf_s: float, *, source: str, mtbf_note: str,
           every_steps: int | None = None, failures: int = 0) -> dict[str, Any]:
    """The advice for a measured blocking save of ``save_s`` and steps of ``step_s`` under an MTBF of ``mtbf_s``
    (``source``: observed / setting / env / assumed; ``mtbf_note``: its words), compared with the configured
    ``every_steps`` (None or 0: only at the end). A JSON-able dict (docs/operations.md lists its keys)."""
    tau = daly(save_s, mtbf_s)
    steps = steps_for(tau, step_s)
    current = every_steps * step_s if every_steps else None
    return {"every_steps": steps, "interval_s": steps * step_s, "daly_s": tau, "young_s": young(save_s, mtbf_s),
            "method": "daly", "save_s": save_s, "mean_step_s": step_s, "mtbf_s": mtbf_s, "mtbf_source": source,
            "mtbf_note": mtbf_note, "failures": failures, "current_every_steps": every_steps or None,
            "current_interval_s": current, "expected_loss": expected_loss(steps * step_s, save_s, mtbf_s),
            "current_expected_loss": expected_loss(current, save_s, mtbf_s) if current else None}


def duration(seconds: float) -> str:
    """12 s, 1.5 s, 8.0 min, 4.0 h."""
    if seconds < 10:
        return f"{seconds:.2g} s" if seconds < 1 else f"{seconds:.1f} s"
    if seconds < 100:
        return f"{seconds:.0f} s"
    if seconds < 6000:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def advice_words(advice: dict[str, Any]) -> str:
    """``every 120 steps (Daly, save 12 s blocking, MTBF 4.0 h observed from 3 failures)``."""
    return (f"every {advice['every_steps']} steps ({duration(advice['interval_s'])}; Daly, save "
            f"{duration(advice['save_s'])} blocking, MTBF {duration(advice['mtbf_s'])} {advice['mtbf_note']})")


def advice_line(advice: dict[str, Any], *, auto: bool = False) -> str:
    """The configured interval and the advised one, with the expected share of time lost by each::

        checkpoint every 20 steps (3.2 min); advised every 60 steps (9.6 min; Daly, save 12 s blocking, MTBF 4.0 h
        observed from 3 failures); expected loss 4.1 % vs 6.6 % now

    ``auto``: the interval in use is the one ``checkpoint.every=auto`` chose last (said so)."""
    every = advice["current_every_steps"]
    now = "checkpoint only at the end"
    if every:
        now = f"checkpoint every {every} steps ({duration(advice['current_interval_s'])}"
        now += ", chosen by every=auto)" if auto else ")"
    line = f"{now}; advised {advice_words(advice)}; expected loss {100 * advice['expected_loss']:.1f} %"
    if advice["current_expected_loss"] is not None:
        line += f" vs {100 * advice['current_expected_loss']:.1f} % now"
    return line
