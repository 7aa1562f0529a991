"""The driver's side of a gang with hot spares (`@torchrun(spares=k)`; the model: distributed/gangboard.py).

At submission (`prepare`) the unit gets N + k members: its specs say which member runs each node (generation 0;
on an engine whose main node ends the job when it exits, AWS Batch, the main node is kept as the last spare), and
generation 0 is posted before any member starts. At every poll of the job (`check`) an active member is judged
lost when
- its process ended without a word of its own (killed by a signal, or it left as replaced): a local member;
- its heartbeat went silent (runtime/driver/lostnodes.py: NodeWatch): a remote one; two missed beats are enough once a
  survivor said its torchrun failed after the silent node's last beat (`failed-*.json`); or its engine says it ended
  (a killed container: 137) and its task wrote no manifest.
Then, if a spare is alive (its process runs; a remote one rewrote its record within `SPARE_FRESH_S`), the next
generation gives the lost node's slot to it: the task keeps its attempt and goes on under the spare's member (no
new submission, no queue); the survivors restart torchrun on the new rendezvous. With no spare left, the gang fails
as it always did (the attempt, then `@retry` resubmits the whole gang). A node that fails with its own manifest
(an error in the training code, a deterministic one above all) ends the gang as before: only a lost node is
replaced. When the gang is over, `end.json` sends the spares that were not needed home.

Each replacement is shown as it happens, and once the new generation has done its first training step, with the
recovery time (the loss, by the lost node's last beat or its exit, to that step).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from stoker.runtime.contract import EXITED, JobRef, JobStatus, Unit
from stoker.runtime.driver.lostnodes import NodeWatch
from stoker.store.manifest import manifest_name

if TYPE_CHECKING:  # (imported where used: a run without spares never needs them, ~2 ms of its start)
    from stoker.distributed.gangboard import GangBoard, Generation

SPARE_FRESH_S = 10.0  # a remote spare whose record is older than this is not taken
READ_BEATS_S = 0.25  # the least seconds between two reads of a gang with spares' heartbeats (one GET per node)


@dataclass
class _Gang:
    board: GangBoard
    num_nodes: int
    members: int  # N + k
    remote: bool
    gen: Generation
    used: set[int] = field(default_factory=set)  # members that ran a slot (active now, or lost)
    reported: set[int] = field(default_factory=set)  # generations whose recovery time was shown
    evictions: set[int] = field(default_factory=set)  # generations whose eviction request was handled
    told: set[int] = field(default_factory=set)  # lost members with no spare left, said once
    lost_at: dict[int, float] = field(default_factory=dict)  # generation -> when its lost node was lost
    last: tuple[JobRef, list[Any], JobStatus, float] | None = None  # the last check's arguments (recheck)


class Spares:
    """The gangs with spares of one run (one per scheduler)."""

    def __init__(self, store: Any, flow: str, run_id: str, say: Any, watch: NodeWatch) -> None:
        self.store, self.flow, self.run_id, self.say, self.watch = store, flow, run_id, say, watch
        self.gangs: dict[str, _Gang] = {}  # job id -> its gang

    # -- submission --------------------------------------------------------------------------------------------
    def prepare(self, unit: Unit, spares: int, main_node_spare: bool) -> None:
        """Give `unit` (a gang) its spares: each spec's member, the unit's first slots; post generation 0."""
        n = len(unit.specs)
        from stoker.distributed.gangboard import GangBoard, Generation, first_slots

        slots = first_slots(n, spares, main_node_spare)
        unit.spares, unit.first_slots = spares, slots
        unit.specs = [replace(s, parallel=s.parallel.with_spares(spares, slots[i]))  # type: ignore[union-attr]
                      for i, s in enumerate(unit.specs)]
        gen = Generation(0, slots)
        first = unit.specs[0]
        GangBoard.of(self.store, self.flow, self.run_id, unit.step, first.task_id, first.attempt).post(gen)

    def track(self, ref: JobRef, unit: Unit, remote: bool) -> None:
        """Watch the submitted gang job `ref` of `unit` (prepared)."""
        first = unit.specs[0]
        from stoker.distributed.gangboard import GangBoard, Generation

        board = GangBoard.of(self.store, self.flow, self.run_id, unit.step, first.task_id, first.attempt)
        gen = Generation(0, unit.first_slots)
        self.gangs[ref.job_id] = _Gang(board, len(unit.specs), unit.nodes, remote, gen, used=set(gen.slots))

    # -- each poll -----------------------------------------------------------------------------------------------
    def check(self, ref: JobRef, tasks: list[Any], status: JobStatus, now: float) -> None:
        """Replace the lost active members of the gang job `ref` by spares (see the module docstring)."""
        g = self.gangs.get(ref.job_id)
        if g is None:
            return
        g.last = (ref, tasks, status, now)
        self._report(g, tasks[0].step, now)
        running = [t for t in tasks if t.state == "running" and t.job is ref and not t.stopping]
        if not running or len(running) < len([t for t in tasks if t.job is ref and t.state != "ok"]):
            return  # the gang is being stopped, or a node failed on its own: not ours to mend
        self._evict(g, ref, running, status)
        found = None
        if g.remote and now - self.watch.checked.get(ref.job_id, 0.0) >= min(self.watch.every, READ_BEATS_S):
            said = g.board.failures(g.gen.gen)  # survivors whose torchrun failed: a peer left them
            found = self.watch.lost(ref, tasks, now, peer_failed_at=min(said.values()) if said else None)
        for t in running:
            lost = self._lost(g, t, tasks, status, found, now)
            if lost is None:
                continue
            spare = self._spare(g, status, now)
            if spare is None:
                if t.member not in g.told:  # once; the gang fails as without spares (lostnodes.watch_gang)
                    g.told.add(t.member)
                    self.say(f"gang {t.step}: node {t.parallel.node_index} (member {t.member}) {lost[0]}; no spare "
                             f"left{self._unfit(g)}: the gang fails as one", "bold red")
                self.watch.checked.pop(ref.job_id, None)  # the heartbeat watch judges it again in this pass
                return
            self._replace(g, t, spare, lost, ref)

    def due(self, now: float) -> float | None:
        """When a remote gang's heartbeats are next to be read between two polls of its engine (`recheck`)."""
        times = [g.last[3] + READ_BEATS_S for g in self.gangs.values() if g.remote and g.last is not None]
        return min(times) if times else None

    def recheck(self, now: float) -> None:
        """Between two polls of the engine (one a second on Slurm, sacct's load), read the remote gangs' heartbeats
        every READ_BEATS_S, with what the engine said last: a lost node's slot goes to a spare that much sooner."""
        for g in list(self.gangs.values()):
            if g.remote and g.last is not None and now - g.last[3] >= READ_BEATS_S:
                ref, tasks, status, _ = g.last
                self.check(ref, tasks, status, now)

    def _evict(self, g: _Gang, ref: JobRef, running: list[Any], status: JobStatus) -> None:
        """A straggler node its trainer asked to evict (after a checkpoint): a spare takes its place."""
        if g.gen.gen in g.evictions:
            return
        ev = g.board.eviction(g.gen.gen)
        if not ev:
            return
        g.evictions.add(g.gen.gen)
        t = next((t for t in running if t.parallel.node_index == ev.get("node")), None)
        if t is None:
            return
        spare = self._spare(g, status, time.time())
        why = str(ev.get("message") or "a straggler").removeprefix("straggler: ")
        if spare is None:
            self.say(f"gang {t.step}: node {t.parallel.node_index} is a straggler ({why}); no spare left to take its "
                     f"place: it stays", "yellow")
            return
        self._replace(g, t, spare, (f"evicted as a straggler after the checkpoint of step {ev.get('step')}: {why}",
                                    float(ev.get("at") or time.time()), str(ev.get("host") or "?")), ref)

    def _lost(self, g: _Gang, t: Any, tasks: list[Any], status: JobStatus, found: Any,
              now: float) -> tuple[str, float, str] | None:
        """(why, when, host) when the member running task `t` is lost, else None."""
        from stoker.distributed.generations import EXIT_REPLACED

        s = status.member(t.member)
        if s.state == EXITED and (fault := g.board.fault(t.member)):
            return f"left: {fault.get('why')}", float(fault.get("at") or now), (s.hosts or ["?"])[0]
        if s.state == EXITED and (s.exit_code is None or s.exit_code < 0 or s.exit_code == EXIT_REPLACED):
            how = f"killed by signal {-s.exit_code}" if s.exit_code and s.exit_code < 0 else "gone"
            return f"lost: its process was {how}", now, (s.hosts or ["?"])[0]
        if s.state == EXITED and s.exit_code and g.remote and not self._wrote_manifest(t):
            # e.g. a container killed (137): the engine says it ended, and its task said nothing
            why = f"lost: it ended with exit code {s.exit_code} without a word of its task" + \
                (f" ({s.reason})" if s.reason else "")
            return why, now, (s.hosts or ["?"])[0]
        if found is not None and tasks[found.node] is t:
            return f"lost: no heartbeat for {found.silent_s:.0f} s", found.last_beat, found.host
        return None

    def _wrote_manifest(self, t: Any) -> bool:
        try:
            return bool(self.store.exists(manifest_name(self.flow, self.run_id, t.step, t.task_id, t.attempt)))
        except Exception:  # noqa: BLE001 - unknown: not a loss
            return True

    def _spare(self, g: _Gang, status: JobStatus, now: float) -> int | None:
        """A live spare member not used yet and not unfit, in the engine's order (member 0 last where it is kept for
        last)."""
        order = [m for m in range(g.members) if m not in g.used and m != 0] + ([0] if 0 not in g.used else [])
        for m in order:
            if status.member(m).state == EXITED:
                continue
            rec = g.board.member(m) or {}
            if rec.get("state") == "unfit":  # its preflight checks failed while it waited (runtime/member/standby.py)
                continue
            if g.remote and (rec.get("state") != "standby" or time.time() - float(rec.get("at") or 0) > SPARE_FRESH_S):
                continue
            return m
        return None

    @staticmethod
    def _unfit(g: _Gang) -> str:
        """` (member 2 is unfit: its preflight ...)` for the spares whose checks failed, else ""."""
        unfit = [(m, rec.get("why") or "its preflight checks failed") for m in range(g.members) if m not in g.used
                 and (rec := g.board.member(m) or {}).get("state") == "unfit"]
        return "".join(f" (member {m} is unfit: {why})" for m, why in unfit)

    def _replace(self, g: _Gang, t: Any, spare: int, lost: tuple[str, float, str], ref: JobRef) -> None:
        why, at, host = lost
        slot, old = t.parallel.node_index, t.member
        slots = list(g.gen.slots)
        slots[slot] = spare
        from stoker.distributed.gangboard import Generation

        nxt = Generation(g.gen.gen + 1, slots, lost={"slot": slot, "member": old, "host": host, "why": why,
                                                     "at": at}, joined=spare)
        g.board.post(nxt)
        g.gen, t.member = nxt, spare
        g.used.add(spare)
        g.lost_at[nxt.gen] = at
        self.watch.seen.get(ref.job_id, {}).pop(slot, None)  # its beats start again, from the spare
        self.say(f"gang {t.step}: node {slot} (member {old}, host {host}) {why}; spare member {spare} takes its "
                 f"place in generation {nxt.gen}, in the same job", "bold yellow")

    def _report(self, g: _Gang, step: str, now: float) -> None:
        for gen, at in g.lost_at.items():
            if gen in g.reported:
                continue
            started = g.board.started(gen)
            if started is not None:
                g.reported.add(gen)
                self.say(f"gang {step}: generation {gen} recovered in {started - at:.1f} s (the loss to its first "
                         f"training step)", "yellow")

    # -- the end -------------------------------------------------------------------------------------------------
    def over(self, ref: JobRef, tasks: list[Any]) -> None:
        """The gang job has no running task: its waiting spares may go."""
        g = self.gangs.pop(ref.job_id, None)
        if g is None:
            return
        self._report(g, tasks[0].step, time.time())
        try:
            g.board.end("done" if all(t.state == "ok" for t in tasks) else "stopped")
        except Exception:  # noqa: BLE001 - the spares then end with the job
            pass
