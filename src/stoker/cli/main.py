"""The `stoker` command: runs, show, logs, quickstart, data, and the cluster commands as they land."""

from __future__ import annotations

import argparse
import sys

from stoker.cli.argtypes import non_negative_int, positive_int
from stoker.cli.errors import run_cli
from stoker.errors import ConfigError


def cmd_runs(args: argparse.Namespace) -> int:
    from stoker.cli.listing import print_runs
    from stoker.client import Flow, Metaflow, get_namespace, namespace

    if args.all:
        namespace(None)
    else:
        get_namespace()  # user:NAME from $STOKER_USER ...: a name that cannot be one is refused here, even with no runs
    flows = [Flow(args.flow)] if args.flow else list(Metaflow())
    runs = []
    for flow in flows:
        for i, run in enumerate(flow.runs()):
            if i >= args.limit:
                break
            runs.append(run)
    print_runs(runs, args.json)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    import json

    from stoker.cli.listing import show_lines, show_record, width
    from stoker.client import Run

    parts = args.pathspec.strip("/").split("/")
    if len(parts) != 2:
        raise ConfigError(f"show {args.pathspec}: give FLOW/RUN (see `stoker runs`)")
    run = Run(args.pathspec)
    from stoker.backends.aws.cost import run_cost
    from stoker.errors import StokerError

    try:  # node-hours and estimated cost, when something ran off this machine
        summary = run_cost(run._store, run.flow_name, run.id)
        cost = summary.lines() if summary.worth_showing else None
    except (StokerError, OSError) as e:
        cost = [f"cost: not available ({e})"]
    from stoker.cli.goodput import run_ledger, summary

    try:  # where the training steps' time went (the goodput ledger), when the run has one
        goodput = summary(run_ledger(run._store, run.flow_name, run.id))
    except (StokerError, OSError) as e:
        goodput = {"error": str(e)}
    rec = show_record(run, cost, goodput)
    if args.json:
        print(json.dumps(rec, indent=1, default=str))
    else:
        print("\n".join(show_lines(rec, run.created_at, width())))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from stoker.cli.logs import print_engine_logs, print_logs

    if args.engine or args.follow:
        return print_engine_logs(args.pathspec, follow=args.follow)
    if args.stacks:
        from stoker.cli.stacks import print_hang_stacks

        return print_hang_stacks(args.pathspec, args.attempt)
    return print_logs(args.pathspec, stderr=args.stderr, attempt=args.attempt, all_attempts=args.all_attempts)


def cmd_kill(args: argparse.Namespace) -> int:
    from stoker.cli.guardian import kill_run
    from stoker.store.blobs import open_store

    parts = args.pathspec.strip("/").split("/")
    if len(parts) != 2:
        raise ConfigError(f"kill {args.pathspec}: give FLOW/RUN (see `stoker runs`)")
    return kill_run(open_store(), parts[0], parts[1])


def cmd_quickstart(args: argparse.Namespace) -> int:
    import os

    from stoker.recipes import quickstart_path

    path = str(quickstart_path())
    print(f"stoker quickstart: python {path} run {' '.join(args.rest)}".rstrip(), flush=True)
    os.execv(sys.executable, [sys.executable, path, "run", *args.rest])
    return 0  # not reached


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="stoker", description="Develop, run and scale LLM training pipelines.")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("runs", help="list runs (newest first)")
    p.add_argument("flow", nargs="?")
    p.add_argument("--limit", type=positive_int, default=20, help="at most this many runs of each flow (20)")
    p.add_argument("--all", action="store_true", help="runs of every user (namespace None)")
    p.add_argument("--json", action="store_true", help="print a JSON list for scripts (keys: docs/operations.md)")
    p.set_defaults(fn=cmd_runs)
    p = sub.add_parser("show", help="steps, tasks and artifacts of FLOW/RUN")
    p.add_argument("pathspec")
    p.add_argument("--json", action="store_true", help="print one JSON object for scripts (keys: docs/operations.md)")
    p.set_defaults(fn=cmd_show)
    p = sub.add_parser("logs", help="logs of FLOW/RUN/STEP[/TASK]")
    p.add_argument("pathspec")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--stdout", action="store_true", help="the task's stdout (the default)")
    which.add_argument("--stderr", action="store_true", help="the task's stderr")
    which.add_argument("--stacks", action="store_true", help="the stacks recorded when an attempt was stopped as hung")
    p.add_argument("--attempt", type=non_negative_int)
    p.add_argument("--all-attempts", action="store_true", help="every attempt of every task (retries included)")
    p.add_argument("--engine", action="store_true", help="the cluster's own logs of every node and attempt "
                   "(CloudWatch Logs on AWS Batch, the node files on Slurm); FLOW/RUN[/STEP[/TASK]]")
    p.add_argument("--follow", "-f", action="store_true", help="with --engine: print new lines until the jobs end")
    p.set_defaults(fn=cmd_logs)
    p = sub.add_parser("kill", help="cancel every live job of FLOW/RUN (Slurm ...) and stop its run process")
    p.add_argument("pathspec")
    p.set_defaults(fn=cmd_kill)
    p = sub.add_parser("quickstart", help="run the quickstart pretraining pipeline here (embedded defaults)")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="passed to `run` (e.g. --set train.steps=50)")
    p.set_defaults(fn=cmd_quickstart)
    try:
        from stoker.cli.data import register as register_data

        register_data(sub)
    except ImportError:  # the data layer is optional at import time
        pass
    from stoker.cli.image import register as register_image
    from stoker.cli.infra import register as register_infra

    register_image(sub)
    register_infra(sub)
    from stoker.cli.cards import register as register_cards
    from stoker.cli.ui import register as register_ui

    register_cards(sub)
    register_ui(sub)
    from stoker.cli.reindex import register as register_reindex

    register_reindex(sub)
    from stoker.cli.goodput import register as register_goodput

    register_goodput(sub)
    from stoker.cli.stacks import register as register_stacks

    register_stacks(sub)
    return ap


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line read; `quickstart` takes everything after it as it is, options included (argparse's
    REMAINDER does not take a first word that starts with `-`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["quickstart"] and not {"-h", "--help"} & set(argv[1:2]):
        args = build_parser().parse_args(argv[:1])
        args.rest = argv[1:]
        return args
    return build_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    def command() -> int | None:
        args = parse(argv)  # inside run_cli: `stoker --help | head -1` ends as quietly as a command
        return args.fn(args)

    run_cli(command)


if __name__ == "__main__":
    main()
