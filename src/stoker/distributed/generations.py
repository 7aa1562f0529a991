"""A node of a gang with spares (`@torchrun(spares=k)`, distributed/gangboard.py) runs its ranks once per generation.

`current.torch.run(...)` on such a node runs the ranks of the gang's current generation: node rank = this node's
slot, rendezvous = the address of the member that runs slot 0 now (member 0: the engine's main address; another:
the address it announced), port = the base port for generation 0, base + 1 + g for generation g (base + 1 is the
preflight's all_reduce). The ranks are forked from the node's warm launcher (distributed/warm.py: torch and the
entrypoint imported once, a static rendezvous, no torchrun agent), so a new generation starts in a fraction of a
second. While they run, the node reads `current.json` every fifth of a second (half a second with an object store);
when the driver posts a newer generation (a node was lost and a spare takes its place) the ranks are killed at once
(their collectives lost a peer: nothing they do now counts) and the next generation's are forked, resuming from the
last committed checkpoint as any restart of the same command does.

When this node's own ranks were killed by SIGKILL or SIGBUS (out of memory, failing memory or device), the node is
at fault: it says so (`fault-*.json`) and leaves, and the driver gives its slot to a spare. When its ranks
fail otherwise, it first waits (`wait_s`: twice the heartbeat timeout and 10 s) for the
driver's word: a newer generation (the failure was a lost peer's) goes on; none means the failure is the gang's own
and it is raised as without spares. A deterministic error (exit 78) or a preemption is raised at once. A member the
driver replaced (it was silent, e.g. stopped, and came back) finds itself in no slot and exits without writing
anything of the task: the spare that took its slot does.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from stoker.distributed.gangboard import POLL_S, GangBoard, Generation, poll_interval
from stoker.errors import ConfigError, Preempted, StokerError
from stoker.flow.current import ParallelInfo, current

EXIT_REPLACED = 3  # a member whose slot was given to a spare: it leaves, and writes nothing of the task
# a worker of this node killed by one of these is the node's fault (the kernel's out-of-memory killer, a bus error of
# failing memory or device): the node leaves its gang and a spare takes its place; an error of the code (an
# exception, an abort) is the gang's own and ends it as without spares
NODE_FAULT_SIGNALS = {9: "SIGKILL: out of memory?", 7: "SIGBUS: failing memory or device?"}


class GenerationCut(StokerError):
    """torchrun was ended because its gang moved to a new generation (a node was replaced by a spare)."""


def decision_wait_s(store_url: str | None, env: Mapping[str, str] | None = None) -> float:
    """How long a node whose torchrun failed waits for the driver to post a newer generation."""
    env = os.environ if env is None else env
    default = 20.0 if (store_url or "").startswith(("s3://", "gs://", "az://")) else 6.0  # as runtime/member/heartbeat
    try:
        timeout = float(env.get("STOKER_HEARTBEAT_TIMEOUT") or default)
    except ValueError:
        timeout = default
    return 2 * timeout + 10


@dataclass
class GangLink:
    """A node's view of its gang's generations: which member it is and where the gang's objects are."""

    board: GangBoard
    member: int
    base_port: int
    main_addr: str
    wait_s: float = 30.0
    poll_s: float = POLL_S
    evict: bool = False  # @torchrun(evict_stragglers=True): node 0 passes its trainer's eviction requests on

    @classmethod
    def for_task(cls, par: ParallelInfo, base_port: int, evict: bool = False) -> GangLink:
        from stoker.store.blobs import open_store

        url = current.get("store_url")
        board = GangBoard.of(open_store(url), current.flow_name, current.run_id, current.step_name,
                             str(par.control_task_id), int(current.retry_count or 0))
        member = par.member if par.member is not None else par.node_index
        return cls(board, member, base_port, par.main_ip, decision_wait_s(url), poll_s=poll_interval(board.store),
                   evict=evict)

    def generation(self) -> Generation:
        """The current generation (the driver posts generation 0 before the members start)."""
        deadline = time.monotonic() + self.wait_s
        while True:
            gen = self.board.current()
            if gen is not None:
                return gen
            if time.monotonic() > deadline:
                raise StokerError(f"no generation of this gang in {self.board.prefix}current.json after "
                                  f"{self.wait_s:.0f} s: the driver posts it when it submits the gang")
            time.sleep(self.poll_s)

    def publish_warmup(self, staged: list[Any], neuron_prefix: str | None, store_url: str | None,
                       preflight: dict[str, Any] | None = None, entry: tuple[str | None, str | None] = (None, None),
                       ) -> None:
        """Tell the spares what this node prepared (runtime/member/standby.py does it too), the entrypoint their
        warm launcher imports (`entry`: module, script), and, with the preflight on, what its local checks need
        (distributed/preflight.local_checks); best effort."""
        try:
            if self.board.warmup() is None:
                self.board.publish_warmup({"stage": [s.url for s in staged], "neuron_cache": neuron_prefix,
                                           "store_url": store_url, "preflight": preflight,
                                           "entry": {"module": entry[0], "script": entry[1]}})
        except Exception as e:  # noqa: BLE001 - the spares then prepare when they are needed
            print(f"stoker: could not tell the spares what to prepare ({e})", file=sys.stderr, flush=True)

    def joining(self) -> bool:
        """This member joins a gang past its first generation (a spare that took a lost node's place)."""
        first = self.board.generation(0)
        return first is not None and self.member not in first.slots

    def rendezvous(self, gen: Generation) -> tuple[str, int]:
        """Where generation `gen` meets: slot 0's member's address; generation 0 on the base port, generation g on
        base + 1 + g (base + 1 is the gang preflight's)."""
        first = gen.slots[0]
        port = self.base_port + 1 + gen.gen if gen.gen else self.base_port  # (base + 1: the preflight's all_reduce)
        if first == 0:
            return self.main_addr, port
        deadline = time.monotonic() + self.wait_s
        while time.monotonic() < deadline:
            rec = self.board.member(first)
            if rec and rec.get("addr"):
                return str(rec["addr"]), port
            time.sleep(self.poll_s)
        raise StokerError(f"member {first}, node 0 of generation {gen.gen}, never announced its address")

    def next_after(self, gen: Generation, wait_s: float) -> Generation | None:
        """A generation newer than `gen` posted within `wait_s` seconds, else None (or the gang ended)."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            now = self.board.current()
            if now is not None and now.gen > gen.gen:
                return now
            if self.board.ended() is not None:
                return None
            time.sleep(self.poll_s)
        return None

    def fault(self, gen: Generation, why: str) -> None:
        """This node's own workers died of an infrastructure signal: say why, and leave for a spare to take the slot
        (the driver sees a member that ended without a word of its task: lost)."""
        print(f"stoker: node {gen.slot_of(self.member)} (member {self.member}): {why}; it leaves its gang for a spare",
              file=sys.stderr, flush=True)
        try:
            self.board.report_fault(self.member, gen.gen, why)
        except Exception:  # noqa: BLE001 - the driver still sees it go
            pass
        sys.stdout.flush()
        os._exit(EXIT_REPLACED)

    def leave(self, gen: Generation) -> None:
        """This member's slot went to a spare: stop now, writing nothing of the task (the spare writes it)."""
        print(f"stoker: member {self.member} was replaced in generation {gen.gen} of its gang; it stops",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(EXIT_REPLACED)


class _Watch:
    """torchrun's `cut_when`: a newer generation cuts it; node 0 reports the generation's first training step."""

    def __init__(self, link: GangLink, gen: Generation, marker: str | None, evict: str | None = None) -> None:
        self.link, self.gen, self.marker, self.evict = link, gen, marker, evict
        self.newer: Generation | None = None
        self.next_read = 0.0

    def __call__(self) -> bool:
        self.report()
        now = time.monotonic()
        if now < self.next_read:
            return False
        self.next_read = now + self.link.poll_s
        latest = self.link.board.current()
        if latest is not None and latest.gen > self.gen.gen:
            self.newer = latest
            return True
        return False

    def report(self) -> None:
        if self.evict and os.path.exists(self.evict):
            try:
                with open(self.evict) as f:
                    self.link.board.request_eviction(self.gen.gen, json.load(f))
                self.evict = None
            except (OSError, ValueError):
                pass
            except Exception as e:  # noqa: BLE001 - the store: the straggler stays
                print(f"stoker: could not ask for the straggler's eviction ({e})", file=sys.stderr)
                self.evict = None
        if self.marker and os.path.exists(self.marker):
            try:
                with open(self.marker) as f:
                    at = float(f.read())
                self.link.board.mark_started(self.gen.gen, at)
                self.marker = None
            except (OSError, ValueError):
                pass
            except Exception as e:  # noqa: BLE001 - the store: the recovery time goes unreported, training goes on
                print(f"stoker: could not record generation {self.gen.gen}'s start ({e})", file=sys.stderr)
                self.marker = None


def run_generations(helper: Any, link: GangLink, start: Callable[[dict[str, str], _Watch], None],
                    env: Mapping[str, str]) -> None:
    """Run this node's ranks (`start(env, cut_when)`: distributed/warm.py's) for each generation this node is part
    of until one succeeds (see the module docstring)."""
    gen = link.generation()
    while True:
        slot = gen.slot_of(link.member)
        if slot is None:
            link.leave(gen)
        addr, port = link.rendezvous(gen)
        helper.node_rank, helper.master_addr, helper.master_port = slot, addr, port
        genv = dict(env)
        marker = evict = None
        if slot == 0:
            folder = current.get("tempdir") or tempfile.gettempdir()
            marker = genv["STOKER_FIRST_STEP_FILE"] = os.path.join(folder, f"first-step-{gen.gen}")
            if link.evict:
                evict = genv["STOKER_EVICT_FILE"] = os.path.join(folder, f"evict-{gen.gen}")
        print(f"torchrun: generation {gen.gen} of the gang: node {slot} (member {link.member}), rendezvous "
              f"{addr}:{port}", flush=True)
        watch = _Watch(link, gen, marker, evict)
        try:
            start(genv, watch)
            watch.report()
            return
        except GenerationCut:
            assert watch.newer is not None
            print(f"torchrun: the gang moved to generation {watch.newer.gen}; restarting from the last checkpoint",
                  flush=True)
            gen = watch.newer
        except (ConfigError, Preempted):
            raise
        except StokerError as e:
            if killed := sorted(c for c in helper.worker_codes if -c in NODE_FAULT_SIGNALS):
                link.fault(gen, f"its workers were killed by signal {-killed[0]} ({NODE_FAULT_SIGNALS[-killed[0]]})")
            try:
                link.board.report_failure(link.member, gen.gen)
            except Exception:  # noqa: BLE001 - the driver then waits for the heartbeat's full timeout
                pass
            nxt = link.next_after(gen, link.wait_s)
            if nxt is None:
                raise
            print(f"torchrun: generation {gen.gen} failed here ({str(e).split(' (')[0]}); the gang goes on in "
                  f"generation {nxt.gen}", flush=True)
            gen = nxt
