"""`stoker card view FLOW/RUN/STEP[/TASK]` and `stoker report FLOW/RUN[/STEP]`.

`card view` reads the card from the store alone (a live card of a running task shows too), writes its HTML to a
temporary file and opens it in the browser (`--print`: only print the file's path). `card list` lists a task's
cards. `report` writes one self-contained HTML file of a run (no script, no network).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from stoker.cli.argtypes import non_negative_int
from stoker.errors import ConfigError


def _task_of(store, pathspec: str, command: str = "card view") -> tuple[str, str, str, str]:
    from stoker.cards.store import steps_with_cards, task_ids_with_cards

    parts = pathspec.strip("/").split("/")
    if len(parts) not in (3, 4) or not all(parts):
        raise ConfigError(f"{command} {pathspec}: give FLOW/RUN/STEP or FLOW/RUN/STEP/TASK (see `stoker runs`)")
    flow, run_id, step = parts[:3]
    if len(parts) == 4:
        return flow, run_id, step, parts[3]
    tasks = task_ids_with_cards(store, flow, run_id, step)
    if not tasks:
        steps = steps_with_cards(store, flow, run_id)
        hint = f"steps of this run with cards: {', '.join(steps)}" if steps else "this run has no cards"
        raise ConfigError(f"{command} {pathspec}: step {step} has no cards in {store.url} ({hint}); put @card above "
                          f"@step to make one")
    if len(tasks) > 1:
        print(f"step {step} has {len(tasks)} tasks with cards ({', '.join(tasks[:8])}"
              f"{' ...' if len(tasks) > 8 else ''}); showing task {tasks[0]}: give FLOW/RUN/STEP/TASK for another",
              file=sys.stderr)
    return flow, run_id, step, tasks[0]


def cmd_card_view(args: argparse.Namespace) -> int:
    from stoker.cards.store import list_cards
    from stoker.store.blobs import open_store

    store = open_store()
    flow, run_id, step, task_id = _task_of(store, args.pathspec)
    refs = list_cards(store, flow, run_id, step, task_id, attempt=args.attempt)
    if not refs:
        raise ConfigError(f"card view {args.pathspec}: task {flow}/{run_id}/{step}/{task_id} has no cards"
                          + (f" in attempt {args.attempt}" if args.attempt is not None else "")
                          + "; put @card above @step to make one")
    if args.id is not None:
        chosen = [r for r in refs if r.id == args.id]
        if not chosen:
            raise ConfigError(f"card view {args.pathspec} --id {args.id}: no such card; this task has "
                              f"{', '.join(r.id for r in refs)}")
        ref = chosen[0]
    else:
        ref = refs[0]
        if len(refs) > 1:
            print(f"task {task_id} has cards {', '.join(r.id for r in refs)}; showing {ref.id} (use --id)",
                  file=sys.stderr)
    fd, path = tempfile.mkstemp(prefix=f"stoker-card-{step}-{task_id}-{ref.id}-", suffix=".html")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(ref.html(store))
    print(path)
    if not args.print:
        import webbrowser

        if not webbrowser.open(f"file://{path}"):
            print("no browser found: open the file above", file=sys.stderr)
    return 0


def cmd_card_list(args: argparse.Namespace) -> int:
    from stoker.cards.store import list_cards
    from stoker.store.blobs import open_store

    store = open_store()
    flow, run_id, step, task_id = _task_of(store, args.pathspec, "card list")
    for ref in list_cards(store, flow, run_id, step, task_id):
        data = ref.data(store)
        print(f"{ref.id}\t{data.get('type')}\tattempt {ref.attempt}\t{'final' if data.get('final') else 'live'}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from stoker.cards.report import build_report

    parts = args.pathspec.strip("/").split("/")
    if len(parts) not in (2, 3) or not all(parts):
        raise ConfigError(f"report {args.pathspec}: give FLOW/RUN or FLOW/RUN/STEP (see `stoker runs`)")
    text = build_report("/".join(parts[:2]), parts[2] if len(parts) == 3 else None)
    out = args.output or f"{parts[0]}-{parts[1]}{'-' + parts[2] if len(parts) == 3 else ''}.html"
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {out} ({len(text.encode()) / 1024:.0f} KB): one self-contained file, opens offline")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add `card` and `report` to the `stoker` command."""
    p = sub.add_parser("card", help="cards of a task: view, list")
    csub = p.add_subparsers(dest="card_command", required=True)
    v = csub.add_parser("view", help="open a task's card in the browser (FLOW/RUN/STEP[/TASK])")
    v.add_argument("pathspec")
    v.add_argument("--id", help="which card, when the task has several (see `stoker card list`)")
    v.add_argument("--attempt", type=non_negative_int, help="an earlier attempt's card (default: the latest)")
    v.add_argument("--print", action="store_true", help="only write the HTML file and print its path")
    v.set_defaults(fn=cmd_card_view)
    ls = csub.add_parser("list", help="the cards of a task (FLOW/RUN/STEP[/TASK])")
    ls.add_argument("pathspec")
    ls.set_defaults(fn=cmd_card_list)
    r = sub.add_parser("report", help="one self-contained HTML report of FLOW/RUN[/STEP] (offline, no script)")
    r.add_argument("pathspec")
    r.add_argument("-o", "--output", help="the file to write (default FLOW-RUN.html here)")
    r.set_defaults(fn=cmd_report)
