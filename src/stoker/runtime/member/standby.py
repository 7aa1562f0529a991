"""A hot spare of a gang (`@torchrun(spares=k)`): a member beyond the gang's nodes waits here, warm, until the driver
gives it a lost node's slot (distributed/gangboard.py), then runs that slot's task like any node.

While it waits it prepares what node 0 prepared before training (`gang/warm.json`: the inputs it staged go into this
node's stage cache, the Neuron compile cache is fetched), then runs the preflight's local checks on what it prepared
(devices, EFA, the entrypoint's imports, the staged data, disk: distributed/preflight.local_checks), and it rewrites
`gang/member-<m>.json` every two seconds (its address, host and state; the driver takes a spare whose record is fresh
and says `standby`, runtime/driver/spares.py). A spare whose checks fail says `unfit` (and why) instead: it is never
given a slot. It leaves when the gang is over (`gang/end.json`): exit 0, no task, no manifest. A spare never writes
anything of a task it was not given.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from stoker.distributed.gangboard import GangBoard, poll_interval
from stoker.runtime.member.nodeenv import NodeIdentity, own_addr
from stoker.runtime.spec import TaskSpec

ANNOUNCE_EVERY_S = 2.0


def board_for(spec: TaskSpec) -> GangBoard:
    """The generation objects of the gang `spec` (any of its nodes) belongs to."""
    from stoker.store.blobs import open_store

    par = spec.parallel
    assert par is not None and par.control_task_id is not None
    return GangBoard.of(open_store(spec.store_url), spec.flow, spec.run_id, spec.step, par.control_task_id,
                        spec.attempt)


def slot_spec(specs: list[TaskSpec], slot: int, ident: NodeIdentity, spares: int) -> TaskSpec:
    """The spec member `ident.member` runs for node `slot` (its gang position filled from the engine)."""
    spec = specs[slot]
    assert spec.parallel is not None
    par = spec.parallel.started(ident.main_addr, ident.port, len(specs)).with_spares(spares, ident.member)
    return replace(spec, parallel=par)


def announce(specs: list[TaskSpec], ident: NodeIdentity, state: str) -> None:
    """Record this member's address in its gang's objects (best effort: said on stderr when it fails)."""
    try:
        board_for(specs[0]).announce(ident.member, own_addr(ident), ident.host or _hostname(), state)
    except Exception as e:  # noqa: BLE001
        print(f"stoker: member {ident.member} could not announce its address ({e})", file=sys.stderr, flush=True)


def wait_for_slot(specs: list[TaskSpec], ident: NodeIdentity, spares: int, board: GangBoard | None = None,
                  poll_s: float | None = None, package: str | None = None,
                  warm_env: dict[str, str] | None = None) -> int | None:
    """Wait as a spare until a generation gives this member a slot (returned), or the gang ends (None). `package`:
    the unpacked code package (where the preflight finds a script entrypoint and the warm launcher starts);
    `warm_env`: the environment the warm launcher starts in (this process's by default)."""
    board = board or board_for(specs[0])
    poll_s = poll_s or poll_interval(board.store)
    addr, host = own_addr(ident), ident.host or _hostname()
    print(f"stoker: spare member {ident.member} of {specs[0].flow}/{specs[0].run_id}/{specs[0].step} waiting "
          f"({addr})", file=sys.stderr, flush=True)
    announced = 0.0
    warming: threading.Thread | None = None
    verdict: dict[str, str] = {}
    while True:
        if warming is None and (todo := board.warmup()) is not None:  # node 0 staged, fetched: do it too, meanwhile
            _warm_ranks(todo.get("entry") or {}, package, warm_env)  # (the main thread: the launcher dies with it)
            warming = threading.Thread(target=warm_up, args=(todo,), name="stoker-spare-warmup", daemon=True,
                                       kwargs={"member": ident.member, "package": package, "verdict": verdict})
            warming.start()
        now = time.monotonic()
        if "unfit" in verdict and verdict.get("said") != "yes":
            announced, verdict["said"] = 0.0, "yes"  # say it now
        if now - announced >= ANNOUNCE_EVERY_S:
            try:
                board.announce(ident.member, addr, host, "unfit" if "unfit" in verdict else "standby",
                               **({"why": verdict["unfit"]} if "unfit" in verdict else {}))
            except Exception as e:  # noqa: BLE001 - a silent spare is not chosen; it tries again
                print(f"stoker: spare could not announce itself ({e})", file=sys.stderr, flush=True)
            announced = now
        gen = board.current()
        if gen is not None and (slot := gen.slot_of(ident.member)) is not None:
            print(f"stoker: spare member {ident.member} takes node {slot} in generation {gen.gen}",
                  file=sys.stderr, flush=True)
            board.announce(ident.member, addr, host, "active")
            return slot
        if board.ended() is not None:
            print("stoker: the gang is over; this spare was not needed", file=sys.stderr, flush=True)
            from stoker.distributed.warm import close_all

            close_all()
            return None
        time.sleep(poll_s)


def _warm_ranks(entry: dict, package: str | None, env: dict[str, str] | None) -> None:
    """Start this spare's warm launcher (distributed/warm.py) on the entrypoint node 0 named: the ranks it runs when
    it takes a node are forked from it, as the survivors' are; best effort (the task starts one otherwise)."""
    if not (entry.get("module") or entry.get("script")):
        return
    try:
        from stoker.distributed.warm import WarmLauncher, zygote_env

        WarmLauncher.get(zygote_env(os.environ if env is None else env), package).preload(entry.get("module"),
                                                                                         entry.get("script"))
    except Exception as e:  # noqa: BLE001
        print(f"stoker: spare could not start its warm launcher ({e}); it starts one when it takes a node",
              file=sys.stderr, flush=True)


def warm_up(todo: dict, stage_fn: Callable[[str], Any] | None = None,
            fetch_fn: Callable[[str, str], Any] | None = None, *, member: int = -1, package: str | None = None,
            verdict: dict[str, str] | None = None) -> list[str]:
    """Prepare what node 0 prepared (`warm.json`): stage its inputs into this node's stage cache (the task's own
    staging then finds them there) and fetch the Neuron compile cache; then, with the preflight on (`preflight` in
    `warm.json`), run its local checks on this node. Staging and fetching are best effort: what fails is said and
    left for the task to do. A failed check puts `unfit` (the problem and the fix) in `verdict`. Returns what it
    did, one line each."""
    done: list[str] = []
    paths: list[str] = []
    for url in todo.get("stage") or []:
        try:
            if stage_fn is None:
                from stoker.distributed.stage import stage

                staged = stage(url)
                paths.append(staged.path)
                done.append(staged.summary())
            else:
                done.append(str(stage_fn(url)))
        except Exception as e:  # noqa: BLE001
            done.append(f"staging {url} failed ({e}); the task stages it when it runs")
    prefix, store_url = todo.get("neuron_cache"), todo.get("store_url")
    if prefix and store_url:
        try:
            if fetch_fn is None:
                from stoker.distributed import neuron_cache
                from stoker.store.blobs import open_store

                local = neuron_cache.local_cache_dir()
                if local is not None:
                    done.append(neuron_cache.fetch(open_store(store_url), prefix, local).summary())
            else:
                done.append(str(fetch_fn(store_url, prefix)))
        except Exception as e:  # noqa: BLE001
            done.append(f"the Neuron compile cache could not be fetched ({e}); the task fetches it when it runs")
    for line in done:
        print(f"stoker: spare warm-up: {line}", file=sys.stderr, flush=True)
    if todo.get("preflight"):
        done.append(_check(todo["preflight"], member, paths, package, verdict))
    return done


def _check(doc: dict, member: int, paths: list[str], package: str | None, verdict: dict[str, str] | None) -> str:
    """The preflight's local checks on this spare (distributed/preflight.local_checks): its line; a failure goes
    into `verdict["unfit"]`."""
    from stoker.distributed.preflight import PreflightError, local_checks

    def say(line: str) -> None:
        print(f"stoker: spare {line}", file=sys.stderr, flush=True)

    try:
        local_checks(doc, node=member, data_paths=paths, cwd=package, out=say)
    except PreflightError as e:
        if verdict is not None:
            verdict["unfit"] = str(e)
        say(f"member {member} is not fit to take a node and will not be given one: {e}")
        return f"unfit: {e}"
    except Exception as e:  # noqa: BLE001 - a check that could not run: said, the spare stays
        say(f"preflight: the local checks could not run ({type(e).__name__}: {e})")
        return "preflight not run"
    return "preflight ok"


def _hostname() -> str:
    return os.uname().nodename
