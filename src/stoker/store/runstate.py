"""Whether a run the index calls ``running`` still runs: the one status its readers (``stoker runs``, ``stoker
show``, the client, the UI) show.

A run's driver records its end twice, in its record in the store (``run.json``, the truth) and in the index. When
it can write neither (a full disk at the end of a run), or is killed before it can, both keep saying ``running``
forever. A reader asks :func:`run_state` about a run the index calls running, and shows it

- with the status of its record when the record says it ended (the index missed its end);
- ``lost`` when its driver left an end marker: an empty object ``runs/F/R/run.ended-<status>``, which the driver
  writes when the record cannot be written (an empty file needs no data block: a full disk still takes it);
- ``lost`` when its driver process is gone: the record names its pid and host, and on that host no process with
  that pid started before the run did (a younger one took over the pid);
- ``running`` otherwise, including a driver on another host (this one cannot tell).

A lost run keeps what its tasks committed: ``python FLOW_FILE resume RUN`` continues it (:func:`resume_hint`).
"""

from __future__ import annotations

import shlex
import socket
from dataclasses import dataclass
from typing import Any

from stoker.store.blobs import BlobStore
from stoker.store.manifest import read_run_record, run_prefix

LOST = "lost"
END_STATUSES = ("succeeded", "failed", "killed")
_CLOCK_SLACK_S = 1.0  # a process's start time is known to the clock tick; the run's record is written after it


@dataclass(frozen=True)
class RunState:
    """The status to show (the index's, the record's, or ``lost``) and, for a lost run, why and how to go on."""

    status: str
    note: str | None = None


def end_marker_name(flow: str, run_id: str, status: str) -> str:
    """The empty object a driver leaves when it cannot write the record of its run's end."""
    return run_prefix(flow, run_id) + f"run.ended-{status}"


def resume_hint(record: dict[str, Any] | None, run_id: str) -> str:
    """How to continue a run whose end was not recorded: its resume command, with the options it ran with when its
    record keeps them (``resume_options``: ``--backend``, ``--with``); what its steps committed is reused."""
    record = record or {}
    options = [str(o) for o in record.get("resume_options") or [] if isinstance(o, str)]
    command = shlex.join(["python", record.get("flow_file") or "FLOW_FILE.py", "resume", *options, run_id])
    return f"continue it with `{command}` (what its steps committed is reused)"


def driver_alive(pid: Any, host: Any, started_at: float | None) -> bool | None:
    """Whether the run's driver (``pid`` on ``host``, running since before ``started_at`` when known) is still
    there; None when this machine cannot tell (another host, or no pid recorded)."""
    if not pid or not host or host != socket.gethostname():
        return None
    import psutil

    try:
        proc = psutil.Process(int(pid))
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return started_at is None or proc.create_time() <= started_at + _CLOCK_SLACK_S  # younger: pid reused
    except psutil.NoSuchProcess:  # (a zombie too)
        return False
    except (psutil.Error, ValueError, TypeError):  # not ours to inspect, or a malformed record: cannot tell
        return None


def run_state(store: BlobStore | None, flow: str, run_id: str, status: str) -> RunState:
    """The status to show for a run the index says is ``status`` (see the module's docstring). Reads the store only
    for a running run; a store or record that cannot be read leaves the index's word."""
    if status != "running" or store is None:
        return RunState(status)
    try:
        record = read_run_record(store, flow, run_id)
        if record is None:  # registered, its record not written yet: starting
            return RunState(status)
        stored = record.get("status", "running")
        if stored != "running":
            return RunState(stored)
        ended = next((s for s in END_STATUSES if store.exists(end_marker_name(flow, run_id, s))), None)
    except Exception:  # noqa: BLE001 - an unreadable store or record: the index's word stands
        return RunState(status)
    if ended is not None:
        return RunState(LOST, f"run {flow}/{run_id} ended ({ended}) but its end could not be recorded (its driver "
                              f"could not write the run's record); {resume_hint(record, run_id)}")
    pid, host = record.get("pid"), record.get("host")
    created = record.get("created_at")
    if driver_alive(pid, host, float(created) if isinstance(created, (int, float)) else None) is False:
        return RunState(LOST, f"run {flow}/{run_id}: its driver (pid {pid} on {host}) is gone and never recorded "
                              f"how the run ended (killed, or its disk was full); {resume_hint(record, run_id)}")
    return RunState(status)
