"""The scheduler's side of failure attribution: each failed attempt's cause (runtime/driver/causes.py) read from what
the scheduler holds, stored in the attempt's manifest (its exception's ``cause`` and ``evidence``), and what the cause
means for the unit's next attempt.

- A deterministic cause (configuration error, stoker's own error, a cancel from outside) is not retried; nor is a user
  code error, an out of memory or a data/IO error that repeats identically (the same cause, exception type and
  message, numbers aside, as the unit's previous attempt) -- unless the step has @catch, whose last attempt must see
  the exception. The run says why in one line.
- An infrastructure cause (node lost / engine failure, network/collective timeout) is retried under @retry; with
  ``$STOKER_INFRA_RETRIES`` (default 0) it also gets that many retries that do not use up @retry, as a preemption
  does (a step without @retry is not run twice by default: it may not be safe to run twice).
- A host blamed for an infrastructure failure twice is excluded from the run's later submissions to an engine that
  can choose hosts (a backend with ``excludes_hosts``: Slurm's ``--exclude``). Batch cannot.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from dataclasses import replace
from typing import Any

from stoker.features.hooks import fallback_attempts
from stoker.runtime.contract import EXITED, Backend, JobStatus, Unit
from stoker.runtime.driver.causes import (
    CANCELLED,
    CONFIG,
    GENERIC_TYPES,
    INFRASTRUCTURE,
    NETWORK,
    NEVER,
    NEVER_STARTS,
    NODE,
    NODE_TYPES,
    STOKER_STOPS,
    UNLESS_REPEATED,
    Cause,
    cause,
    classify,
    signal_of,
)
from stoker.runtime.driver.failures import FIX_AND_RERUN
from stoker.store.manifest import Manifest, log_name, write_manifest

TAIL_BYTES = 32 * 1024  # of each stream: the log's end is where the failure is
EXCLUDE_AFTER = 2  # infrastructure failures blamed on one host before the run avoids it
WROTE_NOTHING = ("TaskDied", "NodeLost")  # a node's attempt the driver wrote the manifest of: it died, or was lost


def max_infra_retries(env: dict[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    try:
        return max(0, int(env.get("STOKER_INFRA_RETRIES", "0")))
    except ValueError:
        return 0


def oom_kill_count(path: str = "/proc/vmstat") -> int | None:
    """How many processes the kernel's OOM killer has killed since boot (Linux; None elsewhere)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


class Attribution:
    """One run's causes: per attempt, per unit (its previous attempt's, to see a repeat), per host."""

    def __init__(self, store: Any, flow_cls: type | None = None, graph: Any = None,
                 oom_kills: Any = oom_kill_count) -> None:
        self.store, self.flow_cls, self.graph = store, flow_cls, graph
        self.causes: dict[tuple[str, int], Cause] = {}  # (task id, attempt) -> its cause
        self.inherited: set[tuple[str, int]] = set()  # attempts stoker stopped with their gang: the cause is another's
        self.gang_first: dict[tuple[str, int], tuple[Any, Cause]] = {}  # (gang, attempt) -> its first failed node
        self.previous: dict[str, str] = {}  # unit -> the signature of its previous failed attempt
        self.hosts: Counter[tuple[str, str]] = Counter()  # (backend, host) -> infrastructure failures blamed on it
        self.free: dict[str, int] = {}  # unit -> infrastructure retries it got without using up @retry
        self.culprit: dict[str, Any] = {}  # unit -> the task its last failure is blamed on
        self._oom_kills = oom_kills
        self._oom_seen = oom_kills()

    # -- one attempt ---------------------------------------------------------------------------------
    def record(self, t: Any, manifest: dict) -> dict:
        """Classify a failed attempt and put its cause in its manifest (written again); the manifest to index."""
        c = self.cause_of(t, manifest)
        exc = manifest.get("exception") or {}
        if not exc or (exc.get("cause"), exc.get("evidence")) == (c.kind, c.evidence):
            return manifest
        out = Manifest.from_dict(manifest).with_cause(c.kind, c.evidence).to_dict()
        write_manifest(self.store, out)
        return out

    @staticmethod
    def refused(manifest: dict) -> dict:
        """The manifest of an attempt the engine refused (nothing ran), its cause put in: a configuration error when
        the refusal says what to change, else the engine's failure."""
        c = classify(manifest)
        if c.kind != CONFIG:
            exc = manifest.get("exception") or {}
            c = cause(NODE, f"the engine refused the submission: {exc.get('type')}: {exc.get('message')}")
        manifest["exception"] = dict(manifest.get("exception") or {}, **c.as_record())
        return manifest

    def cause_of(self, t: Any, manifest: dict) -> Cause:
        key = (t.task_id, t.attempt)
        if key in self.causes:
            return self.causes[key]
        stop = t.stop_reason or ""
        by_stoker = bool(stop) and not stop.startswith(("it exceeded", NEVER_STARTS))  # not its own fault
        first = self.gang_first.get((t.gang, t.attempt)) if t.gang else None
        if by_stoker and first is not None:
            node, c = first[0].parallel.node_index, first[1]
            found = replace(c, evidence=f"stopped with its gang: node {node} failed: {c.evidence}")
            self.inherited.add(key)
        else:
            status = JobStatus(EXITED, exit_code=t.exit_code, reason=t.engine_reason)
            tail = "" if stop.startswith(STOKER_STOPS) else self._tail(t, manifest)  # (a stopped task's says nothing)
            found = classify(manifest, status, tail, stop_reason=t.stop_reason, host_oom=self._host_oom(t, manifest))
            if t.gang and not by_stoker:
                self.gang_first.setdefault((t.gang, t.attempt), (t, found))
        self.causes[key] = found
        return found

    def _host_oom(self, t: Any, manifest: dict) -> bool:
        """The OOM killer ran since the last one seen, and this task ran here and was killed by SIGKILL (itself, or a
        worker: its exception says nothing specific): the first such task takes it."""
        generic = ((manifest.get("exception") or {}).get("type") or "") in GENERIC_TYPES
        if t.backend is None or t.backend.remote or not (signal_of(t.exit_code) == signal.SIGKILL or generic):
            return False
        now = self._oom_kills()
        grew = now is not None and self._oom_seen is not None and now > self._oom_seen
        self._oom_seen = now if now is not None else self._oom_seen
        return grew

    def _tail(self, t: Any, manifest: dict) -> str:
        """The end of the attempt's stderr and stdout: as streamed here, else as the store has it."""
        out = []
        for stream in ("stderr", "stdout"):
            data = b""
            if t.output is not None and t.output.files:
                data = _file_tail(t.output.paths[stream])
            if not data and t.backend is not None and t.backend.remote:
                name = (manifest.get("logs") or {}).get(stream) or log_name(
                    manifest["flow"], manifest["run_id"], t.step, t.task_id, t.attempt, stream)
                data = _object_tail(self.store, name)
            out.append(data.decode("utf-8", "replace"))
        return "\n".join(out)

    # -- the unit's next attempt ------------------------------------------------------------------------
    def unit_cause(self, unit: list[Any], first: Any) -> Cause:
        """The cause of the unit's attempt: its first failed task's, unless that one only saw the failure (a
        collective timeout, or a guess from how it ended) and another node of the gang knows better: one with a
        specific cause, else one that died by SIGKILL without writing its manifest."""
        own = self.cause_of(first, first.manifest or {})
        self.culprit[first.unit_key] = first
        if len(unit) == 1:
            return own
        ranked = [(self._rank(g, c), g, c) for g in unit if g is not first
                  and (c := self.causes.get((g.task_id, g.attempt))) is not None]
        best = max(ranked, key=lambda r: r[0], default=None)
        if best is None or best[0] <= self._rank(first, own):
            return own
        _, g, c = best
        self.culprit[first.unit_key] = g
        host = self.host_of(g)
        return replace(c, evidence=f"node {g.parallel.node_index}" + (f" ({host})" if host else "") +
                       f": {c.evidence}")

    def _rank(self, t: Any, c: Cause) -> int:
        """How much a gang node's cause explains the gang's failure: 3 its heartbeats stopped (the driver judged it
        lost); 2 a specific cause; 1 it died by SIGKILL without a word; 0 it only saw the failure (a collective
        timeout), was stopped with the gang, or is a guess."""
        etype = ((t.manifest or {}).get("exception") or {}).get("type")
        if c.kind in (NETWORK, CANCELLED) or (t.task_id, t.attempt) in self.inherited:
            return 0
        if etype in NODE_TYPES:
            return 3
        if not c.weak:
            return 2
        return 1 if etype in WROTE_NOTHING and signal_of(t.exit_code) == signal.SIGKILL else 0

    def verdict(self, unit: list[Any], first: Any, c: Cause) -> str | None:
        """Why the unit is not retried ("not retried: ..."'s rest), or None: its cause allows another attempt."""
        key = first.unit_key
        before, self.previous[key] = self.previous.get(key), c.signature
        if c.retry == NEVER and c.kind == CANCELLED:
            return f"it was cancelled ({c.evidence}); `resume` runs it again"
        if c.retry == NEVER:
            return f"{c.label} is deterministic: {FIX_AND_RERUN}; fix it and run again"
        if c.retry == UNLESS_REPEATED and before == c.signature and not self._catches(unit, first):
            return (f"{c.label} repeated identically on attempt {first.attempt}, so it is deterministic: "
                    f"{FIX_AND_RERUN}; fix it and run again")
        return None

    def _catches(self, unit: list[Any], first: Any) -> bool:
        """Whether a decorator (@catch) handles the step's last failure: then every attempt runs, as Metaflow's."""
        if self.flow_cls is None or self.graph is None or (len(unit) != 1 and not first.gang):
            return False
        return fallback_attempts(getattr(self.flow_cls, first.step), self.graph[first.step].kind)[0] > 0

    def free_attempt(self, unit: list[Any], first: Any, c: Cause) -> str | None:
        """An infrastructure retry that does not use up @retry ($STOKER_INFRA_RETRIES), and the line to show."""
        used, most = self.free.get(first.unit_key, 0), max_infra_retries()
        if c.kind not in INFRASTRUCTURE or used >= most:
            return None
        self.free[first.unit_key] = used + 1
        for g in unit:
            g.max_attempts += 1
        return f"{c.line()}; retrying without using up @retry (infrastructure retry {used + 1} of at most {most})"

    # -- hosts -----------------------------------------------------------------------------------------
    def blame(self, unit: list[Any], first: Any, c: Cause) -> str | None:
        """Count an infrastructure failure against the host of the node it is blamed on (the one unit_cause named:
        never a whole gang); the line to show when that host reaches EXCLUDE_AFTER."""
        backend = first.backend
        if c.kind not in INFRASTRUCTURE or not getattr(backend, "excludes_hosts", False):
            return None
        host = self.host_of(self.culprit.get(first.unit_key, first))
        if not host:
            return None
        self.hosts[(backend.name, host)] += 1
        if self.hosts[(backend.name, host)] != EXCLUDE_AFTER:
            return None
        return f"host {host} failed {EXCLUDE_AFTER} times ({c.label}): the run's next submissions to {backend.name} " \
               f"exclude it"

    def excluded(self, backend: Backend) -> list[str]:
        return sorted(h for (b, h), n in self.hosts.items() if b == backend.name and n >= EXCLUDE_AFTER)

    def exclude(self, unit: Unit, backend: Backend) -> None:
        """Keep the unit off the hosts that failed twice, where the engine can choose hosts."""
        if getattr(backend, "excludes_hosts", False):
            unit.exclude_hosts = self.excluded(backend)

    @staticmethod
    def host_of(t: Any) -> str | None:
        """Where the task ran: the engine's host list (a gang's node i is its i-th host), else its own manifest's."""
        hosts = list(((t.job.extra or {}).get("hosts") or []) if t.job is not None else [])
        if hosts and (len(hosts) == t.job.members or t.job.members == 1):
            return hosts[t.member] if t.member < len(hosts) else None
        m = t.manifest or {}
        own = ((m.get("exception") or {}).get("type")) not in (*WROTE_NOTHING, "UntrustedManifest")
        return m.get("hostname") if own else None


def _file_tail(path: Any, limit: int = TAIL_BYTES) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read()
    except OSError:
        return b""


def _object_tail(store: Any, name: str, limit: int = TAIL_BYTES) -> bytes:
    try:
        size = store.objects.size(name)
        if not size:
            return b""
        return store.objects.get_range(name, max(0, size - limit), min(size, limit))
    except Exception:  # noqa: BLE001 - best effort: the cause is then found without the log
        return b""
