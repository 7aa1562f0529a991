"""The `stoker` command: runs, show, logs, quickstart, data, and the cluster commands as they land."""

from __future__ import annotations

import argparse
import datetime as dt
import sys

from rich.console import Console
from rich.table import Table

from ..errors import ConfigError
from .errors import run_cli


def _when(t: dt.datetime | None) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S") if t else "-"


def cmd_runs(args: argparse.Namespace) -> int:
    from ..store import Flow, Metaflow, namespace

    if args.all:
        namespace(None)
    flows = [Flow(args.flow)] if args.flow else list(Metaflow())
    table = Table("flow", "run", "status", "user", "started", "took", "tags", box=None, header_style="bold")
    table.columns[1].no_wrap, table.columns[1].min_width = True, 16  # the run id must stay copyable
    for flow in flows:
        for i, run in enumerate(flow.runs()):
            if i >= args.limit:
                break
            took = (run.finished_at - run.created_at).total_seconds() if run.finished_at else None
            table.add_row(flow.id, run.id, run.status, run.user or "-", _when(run.created_at),
                          f"{took:.1f}s" if took is not None else "-", ", ".join(sorted(run.user_tags)))
    Console(highlight=False).print(table)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from ..store import Run

    parts = args.pathspec.strip("/").split("/")
    if len(parts) != 2:
        raise ConfigError(f"show {args.pathspec}: give FLOW/RUN (see `stoker runs`)")
    run = Run(args.pathspec)
    c = Console(highlight=False)
    c.print(f"[bold]{run.pathspec}[/]  {run.status}  user {run.user}  started {_when(run.created_at)}"
            + (f"  resumed from {run.origin_run_id}" if run.origin_run_id else ""))
    if run.parameters:
        c.print("parameters: " + ", ".join(f"{k}={v!r}" for k, v in run.parameters.items()))
    for step in run:
        tasks = list(step)
        ok = sum(1 for t in tasks if t.successful)
        c.print(f"  step [cyan]{step.id}[/]: {ok}/{len(tasks)} tasks succeeded")
        for t in tasks if len(tasks) <= 8 else tasks[:3]:
            arts = ", ".join(f"{a.id}" for a in t.artifacts if not a.id.startswith("_"))
            exc = f"  [red]{t.exception.type}: {t.exception.message}[/]" if t.exception else ""
            c.print(f"    task {t.id} (attempt {t.retry_count}){exc}  artifacts: {arts or '-'}", soft_wrap=True)
    from ..backends.aws.cost import run_cost
    from ..errors import StokerError

    try:  # node-hours and estimated cost, when something ran off this machine
        cost = run_cost(run._store, run.flow_name, run.id)
    except (StokerError, OSError) as e:
        c.print(f"cost: not available ({e})", soft_wrap=True)
    else:
        if cost.worth_showing:
            for line in cost.lines():
                c.print(line, soft_wrap=True, markup=False)
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from .logs import print_engine_logs, print_logs

    if args.engine or args.follow:
        return print_engine_logs(args.pathspec, follow=args.follow)
    return print_logs(args.pathspec, stderr=args.stderr, attempt=args.attempt, all_attempts=args.all_attempts)


def cmd_kill(args: argparse.Namespace) -> int:
    from ..store.blob import open_store
    from .guardian import kill_run

    parts = args.pathspec.strip("/").split("/")
    if len(parts) != 2:
        raise ConfigError(f"kill {args.pathspec}: give FLOW/RUN (see `stoker runs`)")
    return kill_run(open_store(), parts[0], parts[1])


def cmd_quickstart(args: argparse.Namespace) -> int:
    import os

    from ..recipes import quickstart_path

    path = str(quickstart_path())
    print(f"stoker quickstart: python {path} run {' '.join(args.rest)}".rstrip(), flush=True)
    os.execv(sys.executable, [sys.executable, path, "run", *args.rest])
    return 0  # not reached


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="stoker", description="Develop, run and scale LLM training pipelines.")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("runs", help="list runs (newest first)")
    p.add_argument("flow", nargs="?")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--all", action="store_true", help="runs of every user (namespace None)")
    p.set_defaults(fn=cmd_runs)
    p = sub.add_parser("show", help="steps, tasks and artifacts of FLOW/RUN")
    p.add_argument("pathspec")
    p.set_defaults(fn=cmd_show)
    p = sub.add_parser("logs", help="logs of FLOW/RUN/STEP[/TASK]")
    p.add_argument("pathspec")
    p.add_argument("--stderr", action="store_true")
    p.add_argument("--attempt", type=int)
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
        from .data import register as register_data

        register_data(sub)
    except ImportError:  # the data layer is optional at import time
        pass
    from .image import register as register_image
    from .infra import register as register_infra

    register_image(sub)
    register_infra(sub)
    from .cards import register as register_cards
    from .ui import register as register_ui

    register_cards(sub)
    register_ui(sub)
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    run_cli(lambda: args.fn(args))


if __name__ == "__main__":
    main()
