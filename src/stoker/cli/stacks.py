"""`stoker stacks FLOW/RUN[/STEP[/TASK]]`: the Python stack of every thread of every live task and rank of a run.

It asks through the store (runtime/member/stackreq.py), so it reaches a task wherever it runs: each live task's
watchdog answers with its own threads and those of its hooked children (torchrun, every rank, a warm launcher's
forked ranks), which dump their stacks on SIGUSR2 (faulthandler: also while stuck in a collective or a C call).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import IO, Any

from stoker.cli.argtypes import number_at_least
from stoker.errors import ConfigError


def register(sub: Any) -> None:
    p = sub.add_parser("stacks", help="the Python stacks of every live task and rank of FLOW/RUN[/STEP[/TASK]]")
    p.add_argument("pathspec")
    p.add_argument("--wait", type=number_at_least(0.5), default=None, metavar="SECONDS",
                   help="how long to wait for the tasks' answers (default 6 with a store in a folder, 20 with an "
                        "object store: a task looks for a request every 0.5 s, or 5 s)")
    p.set_defaults(fn=cmd_stacks)


def cmd_stacks(args: argparse.Namespace) -> int:
    from stoker.client import Run

    parts = args.pathspec.strip("/").split("/")
    if len(parts) < 2 or len(parts) > 4 or not all(parts):
        raise ConfigError(f"stacks {args.pathspec}: give FLOW/RUN, FLOW/RUN/STEP or FLOW/RUN/STEP/TASK")
    run = Run("/".join(parts[:2]), _namespace_check=False)
    if run.finished:
        print(f"{run.pathspec} has no live tasks: the run is {run.status}")
        return 1
    live = [t for s in run if len(parts) < 3 or s.id == parts[2]
            for t in s if (len(parts) < 4 or t.id == parts[3]) and not t.finished]
    if not live:
        print(f"{args.pathspec} has no live tasks (the run is running: its other steps may be)")
        return 1
    return ask(run._store, parts[0], parts[1], "/".join(parts[2:]), [t.pathspec for t in live], args.wait)


def ask(store: Any, flow: str, run_id: str, scope: str, live: list[str], wait: float | None,
        out: IO[str] = sys.stdout) -> int:
    """Write the request, wait for the answers of the `live` tasks (pathspecs), print them; 1 when none answered."""
    from stoker.runtime.member.stackreq import read_answers, write_request

    nonce = write_request(store, flow, run_id, scope)
    wait = wait if wait is not None else (6.0 if getattr(store, "root", None) is not None else 20.0)
    deadline, docs = time.monotonic() + wait, {}
    while True:
        read_answers(store, flow, run_id, nonce, docs)
        if {d.get("task") for d in docs.values()} >= set(live) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for name in sorted(docs, key=lambda n: docs[n].get("task", "")):
        out.write(docs[name].get("text", "").rstrip("\n") + "\n\n")
        try:
            store.delete(name)
        except Exception:  # noqa: BLE001 - an answer left behind is harmless
            pass
    missing = sorted(set(live) - {d.get("task") for d in docs.values()})
    for p in missing:
        out.write(f"[{p}] no answer within {wait:g} s: it may have just ended, be stuck with the GIL held in C code, "
                  f"or run a stoker without stacks; try again, or raise --wait\n")
    out.flush()
    return 0 if docs else 1


def print_hang_stacks(pathspec: str, attempt: int | None = None, out: IO[str] = sys.stdout) -> int:
    """`stoker logs FLOW/RUN/STEP[/TASK] --stacks`: the stacks recorded when an attempt was stopped as hung (every
    attempt, or `attempt`); 1 when none was."""
    from stoker.client import Step, Task
    from stoker.runtime.member.stackreq import hang_stacks_name

    parts = pathspec.strip("/").split("/")
    if len(parts) not in (3, 4) or not all(parts):
        raise ConfigError(f"logs {pathspec} --stacks: give FLOW/RUN/STEP or FLOW/RUN/STEP/TASK")
    tasks = [Task(pathspec, _namespace_check=False)] if len(parts) == 4 else \
        list(Step(pathspec, _namespace_check=False))
    found = 0
    for t in tasks:
        store = t._store
        for a in ([attempt] if attempt is not None else range(t.current_attempt + 1)):
            name = hang_stacks_name(*t.pathspec.split("/"), a)
            if store.exists(name):
                found += 1
                out.write(f"# {t.pathspec} attempt {a}: stopped as hung; the stacks of its processes then\n")
                out.write(store.read(name).decode(errors="replace").rstrip("\n") + "\n\n")
    if not found:
        out.write(f"{pathspec}: no attempt was stopped as hung (`stoker stacks` shows a live one's stacks)\n")
    return 0 if found else 1
