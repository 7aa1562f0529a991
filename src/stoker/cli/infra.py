"""`stoker infra init | plan | apply | destroy | status`: the AWS resources `@batch` steps run on."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from stoker.cli.argtypes import number_at_least
from stoker.errors import ConfigError

STYLES = {"create": "green", "update": "yellow", "ok": "dim", "use": "cyan", "conflict": "bold red"}


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _say(console: Console) -> Any:
    return lambda line: console.print(Text(line))  # no markup: names and diffs hold brackets


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `infra` command group to an argparse subparsers object."""
    from stoker.backends.aws.infra.config import DEFAULT_CONFIG

    infra = subparsers.add_parser(
        "infra", help="create, show and remove the AWS resources for @batch (plan / apply / destroy / status)",
        description="The AWS resources a Batch run needs (bucket, roles, placement group, launch template with "
                    "EFA, compute environment, job queue, ECR repository), from one TOML file.")
    sub = infra.add_subparsers(dest="infra_command", metavar="{init,plan,apply,destroy,status}")
    sub.required = True
    cfg_help = f"the infra TOML (default ./{DEFAULT_CONFIG})"

    p = sub.add_parser("init", help="write a commented infra TOML to fill in")
    p.add_argument("--config", "-c", default=DEFAULT_CONFIG, help=f"where to write it (default ./{DEFAULT_CONFIG})")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.set_defaults(fn=cmd_init)

    p = sub.add_parser("plan", help="show what apply would create, update or leave (changes nothing)")
    p.add_argument("--config", "-c", default=None, help=cfg_help)
    p.set_defaults(fn=cmd_plan)

    p = sub.add_parser("apply", help="create what is missing and update what differs (twice: no changes)")
    p.add_argument("--config", "-c", default=None, help=cfg_help)
    p.add_argument("--timeout", type=number_at_least(1), default=900, help="seconds to wait for AWS at each step (900)")
    p.set_defaults(fn=cmd_apply)

    p = sub.add_parser("destroy", help="delete what stoker created, in dependency order (bucket kept)")
    p.add_argument("--config", "-c", default=None, help=cfg_help)
    p.add_argument("--name", default=None, help="the infra's name, from its state file, when the TOML is gone")
    p.add_argument("--delete-bucket", action="store_true",
                   help="also delete stoker's S3 bucket and EVERY object in it (the store)")
    p.add_argument("--force", action="store_true", help="delete the ECR repository even when it holds images")
    p.add_argument("--terminate-jobs", action="store_true",
                   help="terminate the job queue's jobs that have not ended (without it destroy refuses while "
                        "there are any, and changes nothing)")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    p.add_argument("--timeout", type=number_at_least(1), default=900, help="seconds to wait for AWS at each step (900)")
    p.set_defaults(fn=cmd_destroy)

    p = sub.add_parser("status", help="each resource as AWS has it now, and the outputs @batch uses")
    p.add_argument("--config", "-c", default=None, help=cfg_help)
    p.add_argument("--name", default=None, help="the infra's name, from its state file")
    p.add_argument("--json", action="store_true", help="print the resources and outputs as JSON")
    p.set_defaults(fn=cmd_status)
    return infra


def _config(args: argparse.Namespace, required: bool = True) -> Any:
    """The config from --config (or ./stoker-infra.toml); None when not required and neither exists."""
    from stoker.backends.aws.infra.config import DEFAULT_CONFIG, load_config

    if getattr(args, "name", None) and not args.config:
        return None
    if args.config or required or Path(DEFAULT_CONFIG).is_file():
        return load_config(args.config)
    return None


def cmd_init(args: argparse.Namespace) -> int:
    from stoker.backends.aws.infra.config import TEMPLATE

    path = Path(args.config)
    if path.exists() and not args.force:
        raise ConfigError(f"{path} exists: edit it, or pass --force to overwrite it")
    try:
        path.write_text(TEMPLATE.format(path=path), encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot write {path} ({e.strerror}): pass --config with a file in an existing, "
                          "writable folder") from None
    _console().print(Text(f"wrote {path}: set subnets and bucket, then `stoker infra plan --config {path}`"))
    return 0


def print_plan(plan: Any, console: Console) -> None:
    table = Table("", "resource", "name", "change", box=None, header_style="bold", pad_edge=False)
    for c in plan.changes:
        detail = "; ".join(c.diffs) or c.note or {"create": "create", "ok": "as desired"}.get(c.action, "")
        table.add_row(Text(_symbol(c.action), style=STYLES[c.action]), c.resource.kind, c.resource.name,
                      Text(detail, style=STYLES[c.action] if c.action != "ok" else "dim"))
    console.print(table)
    for w in plan.ctx.warnings:
        console.print(Text("warning: ", style="yellow") + Text(w))
    console.print(Text(f"plan for {plan.ctx.cfg.name} in {plan.ctx.facts.region}: {plan.summary()}", style="bold"))


def _symbol(action: str) -> str:
    from stoker.backends.aws.infra.plan import SYMBOLS

    return SYMBOLS[action]


def cmd_plan(args: argparse.Namespace) -> int:
    from stoker.backends.aws.infra import plan

    print_plan(plan(_config(args)), _console())
    return 0


def cmd_apply(args: argparse.Namespace) -> int:
    from stoker.backends.aws.infra import apply

    console = _console()
    result = apply(_config(args), report=_say(console), timeout=args.timeout,
                   plan_report=lambda p: print_plan(p, console))
    if result.created or result.updated:
        console.print(Text(f"applied: {len(result.created)} created, {len(result.updated)} updated", style="bold"))
    out = result.outputs or {}
    console.print(Text(f"queue {out.get('queue')}  image {out.get('image')}  store {out.get('store_url')}"))
    console.print(Text("@batch steps use these by default; `stoker infra status` shows them again"))
    return 0


def cmd_destroy(args: argparse.Namespace) -> int:
    from stoker.backends.aws.infra import destroy
    from stoker.backends.aws.infra.state import default_name

    cfg = _config(args, required=False)
    name = cfg.name if cfg else (args.name or default_name())
    if not args.yes:
        what = f"every resource stoker created for infra {name!r}" + (
            ", INCLUDING the S3 bucket and every object in it" if args.delete_bucket else " (the bucket is kept)")
        if not sys.stdin.isatty():
            raise ConfigError(f"destroy deletes {what}: pass --yes to confirm")
        if input(f"Delete {what}? [y/N] ").strip().lower() not in ("y", "yes"):
            print("nothing deleted")
            return 1
    console = _console()
    result = destroy(cfg, name=args.name, delete_bucket=args.delete_bucket, force=args.force,
                     terminate_jobs=args.terminate_jobs, report=_say(console), timeout=args.timeout)
    console.print(Text(f"destroyed {len(result.deleted)} resources" + (
        f"; kept {', '.join(result.kept)}" if result.kept else ""), style="bold"))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from stoker.backends.aws.infra import status

    rows, outputs = status(_config(args, required=False), name=args.name)
    if args.json:
        print(json.dumps({"resources": [r.__dict__ for r in rows], "outputs": outputs}, indent=2))
        return 0
    console = _console()
    table = Table("resource", "name", "owner", "state", box=None, header_style="bold", pad_edge=False)
    for r in rows:
        style = {"stoker": "", "existing": "cyan", "missing": "red"}[r.owner]
        table.add_row(r.kind, r.name, Text(r.owner, style=style), Text(r.detail))
    console.print(table)
    if outputs:
        console.print(Text("outputs: " + ", ".join(f"{k}={v}" for k, v in outputs.items() if v is not None)))
    else:
        console.print(Text("no outputs recorded: run `stoker infra apply`"))
    return 0
