"""When a node of a gang fails (`gang_failed`: the others are stopped, then the gang is retried or fails as one, on
its first failure), and a lost node of a remote gang, found from stoker's own signals: its node agents' heartbeats.

The engine notices a dead host late (Slurm after SlurmdTimeout, 300 s by default) and then says only that "a node
failed", while the survivors' torchrun has failed within seconds and each wrote its own failure: the node that
died wrote nothing, so the first failure on record was a survivor's. Each node of a gang beats in the store
(runtime/member/heartbeat.py); the driver reads the beats of its running remote gangs about once a second and
judges them by its own clock (when a beat last changed, not the time a node wrote in it, so clocks may differ and a
driver that was paused is not misled).

A node is lost when its beat has not changed for `$STOKER_HEARTBEAT_TIMEOUT` seconds (6, or 20 with an object store:
runtime/member/heartbeat.py), it has not ended (no last beat, no manifest), and another node of the gang is alive or has
failed: all nodes silent at once is the store or this host, not a node, and a node silent after every other one ended
well is left to the engine (it may be saving large artifacts with the GIL held, which starves its beat). When the
others' own failures came after its last beat (they report the collective it left), two missed beats are enough. (A node
that the engine stops because another failed, srun's --kill-on-bad-exit, gets SIGTERM first and writes its last beat.)
Then the lost node's attempt fails with `NodeLost` naming it and its host, dated by its last beat so it is the gang's
first failure; the job is cancelled at once and the gang ends now, not when the engine gives up on the host. When the
engine ends the job first, a node silent for 10 s (or the timeout, if shorter) by then is named the same way.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from stoker.runtime.contract import EXITED, RUNNING, JobRef, JobStatus
from stoker.runtime.member.heartbeat import beat_interval, heartbeat_name, heartbeat_timeout
from stoker.store.manifest import manifest_name, manifest_outcome, write_manifest

NODE_LOST = "NodeLost"  # the exception type of a lost node's attempt
# a job the engine ended: a node silent this long by then was lost (a node the engine or the kernel killed, e.g. out of
# memory, is silent only for a beat or two before its job ends, and keeps that evidence)
EXITED_SILENCE_S = 10.0
SETTLE_S = 1.5  # after the cancel, how long a survivor may take to write its own failure before the gang moves on


@dataclass
class Lost:
    """A node judged lost: its place in the gang, its host, how long it had been silent, its last beat (epoch s)."""

    node: int
    host: str
    silent_s: float
    last_beat: float

    def message(self, after: str = "") -> str:
        return (f"node {self.node} (host {self.host}) lost: no heartbeat for {self.silent_s:.0f} s"
                + (f"; {after}" if after else ""))


@dataclass
class _Seen:
    data: bytes  # the beat as last read
    changed: float  # when the driver saw it change (its own clock)
    doc: dict


class NodeWatch:
    """The heartbeats of a run's remote gangs (one per scheduler)."""

    def __init__(self, store: Any, flow: str, run_id: str, timeout: float | None = None) -> None:
        self.store, self.flow, self.run_id = store, flow, run_id
        object_store = getattr(store, "root", "") is None  # s3:// and the like (BlobStore.root: its local folder)
        self.timeout = heartbeat_timeout(object_store=object_store) if timeout is None else timeout
        self.interval = beat_interval(self.timeout)
        self.every = self.interval / 2  # how often a running gang's beats are read
        self.seen: dict[str, dict[int, _Seen]] = {}  # job id -> member -> its last beat
        self.checked: dict[str, float] = {}
        self.abandoned: dict[str, float] = {}  # job id -> when it was cancelled for a lost node

    # -- reading the beats ---------------------------------------------------------------------------
    def _beat(self, t: Any) -> bytes | None:
        name = heartbeat_name(self.flow, self.run_id, t.step, t.task_id, t.attempt)
        try:
            return self.store.read(name) if self.store.exists(name) else None
        except Exception:  # noqa: BLE001 - unreadable now: treat the node as alive (never blame the store on it)
            return b""

    def _ended(self, t: Any) -> bool:
        name = manifest_name(self.flow, self.run_id, t.step, t.task_id, t.attempt)
        try:
            return self.store.exists(name)
        except Exception:  # noqa: BLE001
            return True  # unknown: do not call it lost

    def look(self, ref: JobRef, tasks: list[Any], now: float) -> dict[int, _Seen]:
        """Read the beats of the job's running members; returns each one's last beat seen."""
        seen = self.seen.setdefault(ref.job_id, {})
        for i, t in enumerate(tasks):
            if t.state != "running" or t.job is not ref:
                continue
            data = self._beat(t)
            if data is None:
                continue  # not beating yet (queued, unpacking) or not a beating member
            last = seen.get(i)
            if data == b"":
                if last is not None:
                    last.changed = now
                continue
            if last is None or last.data != data:
                try:
                    doc = json.loads(data)
                except ValueError:
                    doc = {}
                if "member" in doc and doc["member"] != t.member:  # a gang with spares: a replaced member's beats
                    seen.pop(i, None)
                    continue
                seen[i] = _Seen(data, now, doc)
        self.checked[ref.job_id] = now
        return seen

    def lost(self, ref: JobRef, tasks: list[Any], now: float, threshold: float | None = None,
             peer_failed_at: float | None = None) -> Lost | None:
        """The member of `ref` judged lost now (see the module docstring), or None. `peer_failed_at`: when a node of
        a gang with spares said its torchrun failed (it waits for the driver instead of ending)."""
        seen = self.look(ref, tasks, now)
        limit = self.timeout if threshold is None else threshold
        ended = {i: s.doc for i, s in seen.items() if s.doc.get("state") == "ended"}
        alive = {i for i, s in seen.items() if i not in ended and now - s.changed <= limit}
        for i in sorted((i for i in seen if i not in ended), key=lambda i: seen[i].changed):
            s, t = seen[i], tasks[i]
            last_at = float(s.doc.get("at") or 0)
            # the others failed after its last beat: they report the collective it left, so two missed beats will do
            reported = any(d.get("code") and float(d.get("at") or 0) > last_at for j, d in ended.items() if j != i) \
                or (peer_failed_at is not None and peer_failed_at > last_at)
            beat = float(s.doc.get("interval") or self.interval)  # a gang with spares may beat faster
            quiet = now - s.changed > (min(limit, 2 * beat) if reported and threshold is None else limit)
            # evidence that the silence is a loss: a peer still beating (it waits for this one), or one that failed;
            # peers that all ended well say nothing (this node may still be saving its artifacts, the GIL held)
            others = (alive | {j for j, d in ended.items() if d.get("code")}) - {i}
            if not quiet or not others or t.stopping or t.state != "running" or t.job is not ref or self._ended(t):
                continue
            return Lost(i, str(s.doc.get("host") or "?"), now - s.changed, last_at or now)
        return None

    def forget(self, job_id: str) -> None:
        for table in (self.seen, self.checked, self.abandoned):
            table.pop(job_id, None)


def lost_why(t: Any) -> str | None:
    """The message of a lost node's attempt (`node 1 (host n2) lost: ...`), else None."""
    exc = (t.manifest or {}).get("exception") or {}
    return str(exc.get("message", "")) if exc.get("type") == NODE_LOST else None


def gang_failed(sched: Any, t: Any) -> None:
    """A node of a gang ended without success: the first one stops the others (each is told which node failed or was
    lost); once none runs, the gang is retried or fails as one, on its first failure."""
    gang = sched._gang(t)
    live = [g for g in gang if g.state == "running"]
    if t.state == "failed" and t.gang not in sched.gang_failures:
        node, lost = t.parallel.node_index, lost_why(t)
        what = lost or f"node {node} (task {t.task_id}) failed: {sched._why(t)}"
        sched.display.info(f"gang {t.step}: {what}; stopping the other {len(live)} node(s)", style="bold red")
        for g in live:
            sched._stop(g, f"node {node} of its gang {'was lost' if lost else 'failed'}")
        sched.gang_failures[t.gang] = (t, time.time())
    if live:
        return
    first, since = sched.gang_failures.pop(t.gang, (t, None))
    if since is not None:
        sched.display.info(f"gang {t.step} stopped {time.time() - since:.1f} s after node {first.parallel.node_index} "
                           f"{'was lost' if lost_why(first) else 'failed'}")
    sched._again_or_fail(gang, first)


def watch_gang(sched: Any, ref: JobRef, tasks: list[Any], status: JobStatus, now: float) -> None:
    """The scheduler's check of a remote gang job at each poll: a lost node fails its attempt and stops the gang now;
    after that, the other nodes are finished as they end (or a few seconds after the cancel, ended or not)."""
    w: NodeWatch = sched.watch
    running = [t for t in tasks if t.state == "running" and t.job is ref]
    if not running:
        w.forget(ref.job_id)
        return
    if ref.job_id in w.abandoned:
        _settle(sched, ref, tasks, now)
        return
    if any(t.stopping for t in running):
        return  # stoker is stopping it (a failure elsewhere, @timeout, Ctrl-C): silence is expected
    if status.state == EXITED:  # the engine ended it first (its node timeout is shorter): name a node silent by then
        lost = w.lost(ref, tasks, now, threshold=min(w.timeout, EXITED_SILENCE_S))
        if lost is not None:
            _write_lost(sched, tasks[lost.node], lost, tasks)
        w.forget(ref.job_id)  # the scheduler finishes its nodes in this pass
        return
    if status.state != RUNNING or now - w.checked.get(ref.job_id, 0.0) < w.every:
        return
    lost = w.lost(ref, tasks, now)
    if lost is None:
        return
    t = tasks[lost.node]
    why = _write_lost(sched, t, lost, tasks)
    w.abandoned[ref.job_id] = now
    for g in running:  # the survivors cannot finish a collective without it: stop them all, now
        if g is not t:
            g.stopping, g.stop_reason = True, g.stop_reason or f"node {lost.node} of its gang was lost"
    t.backend.cancel(ref, 0.0)
    if t.output is not None:  # on its own line, after what it printed last
        cut = "\n" if t.output.partial["stderr"] else ""
        for line in t.output.feed("stderr", f"{cut}stoker: {why}\n".encode()):
            sched.display.line(t.step, sched._prefix(t), line, "stderr")
    sched._finish(t, -9)  # its NodeLost manifest, the gang's first failure (scheduler._gang_failed)
    _settle(sched, ref, tasks, now)


def _write_lost(sched: Any, t: Any, lost: Lost, tasks: list[Any]) -> str:
    """The lost node's attempt's manifest, dated by its last beat; returns its message."""
    why = lost.message(_after(sched, t, tasks))
    m = sched._spec(t).manifest_head(t.started or lost.last_beat).failed(NODE_LOST, why, finished_at=lost.last_beat)
    write_manifest(sched.store, m.to_dict())
    return why


def _after(sched: Any, lost: Any, tasks: list[Any]) -> str:
    """What the other nodes' own failures said (they come after the loss), shortly."""
    said = []
    for g in tasks:
        if g is lost or g.state != "running" or g.job is not lost.job:
            continue
        m, _ = manifest_outcome(sched.store, manifest_name(sched.flow, sched.run_id, g.step, g.task_id, g.attempt))
        exc = (m or {}).get("exception") or {}
        if exc:
            said.append(f"node {g.parallel.node_index} then failed: {str(exc.get('message', '')).split(' (')[0][:120]}")
    return "; ".join(said)


def _settle(sched: Any, ref: JobRef, tasks: list[Any], now: float) -> None:
    """Finish the stopped survivors of a gang with a lost node: those that ended (a last beat or a manifest) now, the
    others once they had a few seconds to end; the engine may not end the job until it gives the lost host up."""
    w: NodeWatch = sched.watch
    since = w.abandoned[ref.job_id]
    seen = w.look(ref, tasks, now)
    for i, t in enumerate(tasks):
        if t.state != "running" or t.job is not ref:
            continue
        beat = seen.get(i)
        over = beat is not None and beat.doc.get("state") == "ended"
        if over or w._ended(t) or now - since >= SETTLE_S:
            sched._finish(t, -15, None)
    if not any(t.state == "running" and t.job is ref for t in tasks):
        w.forget(ref.job_id)
