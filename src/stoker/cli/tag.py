"""`python flow.py tag add|remove|replace|list`: a run's user tags, with Metaflow's options and output
(system tags are listed but cannot be changed)."""

from __future__ import annotations

import re
import sys
from itertools import chain
from typing import Any

from stoker.errors import ConfigError

_HEADER = ["", "System tags and *tags*; only *tags* can be modified",
           "--------------------------------------------------------", ""]


def add_parser(sub: Any) -> None:
    """Register `tag` and its four commands on the flow CLI's subparsers (Metaflow's options)."""
    tag = sub.add_parser("tag", help="add, remove, replace or list the tags of a run")
    cmds = tag.add_subparsers(dest="tag_command", metavar="{add,remove,replace,list}", required=True)
    for name, help_ in (("add", "add tags to a run"), ("remove", "remove tags from a run"),
                        ("replace", "replace tags of a run atomically: removals first, then additions"),
                        ("list", "list the tags of a run (or of every run of the flow)")):
        p = cmds.add_parser(name, help=help_)
        p.add_argument("--run-id", default=None, help="the run (required except for list)")
        p.set_defaults(quiet=False)  # `python flow.py --quiet tag ...` sets it: parsable output
        if name != "list":
            p.add_argument("--namespace", dest="user_namespace", default=None,
                           help="look the run up in this namespace instead of user:<you>")
        if name in ("add", "remove"):
            p.add_argument("tags", nargs="+")
        elif name == "replace":
            p.add_argument("--add", dest="tags_to_add", action="append", default=[], help="a tag to add (repeatable)")
            p.add_argument("--remove", dest="tags_to_remove", action="append", default=[],
                           help="a tag to remove (repeatable)")
        else:
            p.add_argument("--all", dest="list_all", action="store_true", help="tags of every run of the flow")
            p.add_argument("--my-runs", action="store_true", help="tags of your runs of the flow")
            p.add_argument("--hide-system-tags", action="store_true")
            p.add_argument("--group-by-tag", action="store_true")
            p.add_argument("--group-by-run", action="store_true")
            p.add_argument("--flat", action="store_true", help="one tag a line")
            p.add_argument("arg_run_id", nargs="?", default=None)


def _echo(text: str, quiet: bool = False, err: bool = True) -> None:
    if not quiet:
        print(re.sub(r"\*([^*\n]+)\*", r"\1", text), file=sys.stderr if err else sys.stdout)


def _header(flow: str, quiet: bool) -> None:
    """The first line of a command's output on stderr, as Metaflow's ("Metaflow 2.19.39 executing Flow for
    user:x"): scripts that read `tag list --flat` skip it. --quiet leaves it out; an error is its one line."""
    from importlib.metadata import PackageNotFoundError, version

    from stoker.store.paths import current_user

    try:
        ours = version("stoker")
    except PackageNotFoundError:  # a source tree that is not installed
        ours = "(source)"
    _echo(f"stoker {ours} executing *{flow}* for *user:{current_user()}*", quiet)


def _run(flow: str, run_id: str | None, ns: str | None) -> Any:
    """The run ``flow/run_id`` looked up in namespace ``ns``, or a ConfigError saying what to pass."""
    from stoker.client import Flow, NamespaceMismatch, NotFound, Run, namespace

    namespace(ns)
    try:
        latest = Flow(flow).latest_run
    except NotFound:
        raise ConfigError(f"No run found for {flow}. Please run the flow before tagging.") from None
    if run_id is None:
        hint = f"{flow}'s latest run in namespace {ns} has id {latest.id}." if latest else \
            f"{flow} has no run in namespace {ns}; switch it with --namespace."
        raise ConfigError(f"Please specify a run-id using --run-id.\n{hint}")
    if "/" in run_id:
        raise ConfigError(f"Run-id {run_id} is not a valid run-id (give the id alone, without the flow name)")
    try:
        return Run(f"{flow}/{run_id}")
    except NamespaceMismatch:
        raise ConfigError(f"Run {flow}/{run_id} for flow {flow} does not belong to namespace {ns}; pass "
                          f"--namespace") from None
    except NotFound:
        raise ConfigError(f"No run {flow}/{run_id} found for flow {flow}") from None


def _columns(cells: list[str], max_length: int, star: bool) -> list[str]:
    """Metaflow's layout: columns of ``max_length`` (+2 for a starred tag) in 124 characters, filled down."""
    n = len(cells)
    count = 124 // (max_length + 4)
    per_col = n if count == 0 else (n + count - 1) // count
    count = max(count, 1)
    cells = cells + [" "] * (per_col * count - n)
    lines = []
    for i in range(per_col):
        values = [cells[i + j * per_col] for j in range(count)]
        widths = [max_length + 2 if star and v[0] == "*" else max_length for v in values]
        lines.append("    ".join(f"{v:<{w}}" for v, w in zip(values, widths, strict=True)))
    return lines


def _print_groups(system: dict[str, set], every: dict[str, set], by_tag: bool, quiet: bool) -> None:
    _echo("\n".join(_HEADER), quiet, err=False)
    for group in sorted(set(chain(every, system))):
        tags, sys_tags = every.get(group, set()), system.get(group, set())
        if by_tag:
            for runs, is_system in ((tags, False), (sys_tags, True)):
                if not runs:
                    continue
                if quiet:
                    print(" ; ".join([f"{'system' if is_system else 'user'}:{group}", ",".join(runs)]), file=sys.stderr)
                    continue
                lines = [f"For tag {group if is_system else f'*{group}*'}"]
                lines += _columns(sorted(runs), max(len(r) for r in runs), star=False) + [""]
                _echo("\n".join(lines), err=False)
        elif quiet:
            print(" ; ".join([group, ",".join(sorted(sys_tags)), ",".join(sorted(set(tags) - sys_tags))]),
                  file=sys.stderr)  # on stderr, as Metaflow's echo_always
        else:
            cells = [t if t in sys_tags else f"*{t}*" for t in sorted(tags)]
            lines = [] if len(every) == 1 else [f"For run {group}"]
            lines += _columns(cells, max([len(t) for t in tags] or [0]), star=True) + [""]
            _echo("\n".join(lines), err=False)


def _print_run(run: Any, quiet: bool) -> None:
    _print_groups({run.pathspec: set(run.system_tags)}, {run.pathspec: set(run.tags)}, False, quiet)


def tag_command(flow: str, args: Any, quiet: bool = False) -> int:
    """Run `tag add|remove|replace|list` for ``flow`` as Metaflow's tag CLI does."""
    from stoker.store.paths import current_user

    cmd = args.tag_command
    if cmd == "list":
        return _list(flow, args, quiet)
    if cmd == "replace":
        if not args.tags_to_add and not args.tags_to_remove:
            raise ConfigError("Specify at least one tag to add (--add) and one tag to remove (--remove)")
        if not args.tags_to_remove:
            raise ConfigError("Specify at least one tag to remove; else please use tag add.")
        if not args.tags_to_add:
            raise ConfigError("Specify at least one tag to add, else please use tag remove.")
    ns = args.user_namespace if args.user_namespace is not None else f"user:{current_user()}"
    run = _run(flow, args.run_id, ns)
    if cmd == "add":
        run.add_tags(args.tags)
    elif cmd == "remove":
        run.remove_tags(args.tags)
    else:
        run.replace_tags(args.tags_to_remove, args.tags_to_add)
    _header(flow, quiet)
    _echo("Operation successful. New tags:", quiet, err=cmd != "add")
    _print_run(run, quiet)
    return 0


def _list(flow: str, args: Any, quiet: bool) -> int:
    from stoker.client import Flow, NotFound, namespace
    from stoker.store.paths import current_user

    run_id, list_all = args.run_id, args.list_all
    if run_id is None and args.arg_run_id is None and not list_all and not args.my_runs:
        list_all = True
    if list_all and args.my_runs:
        raise ConfigError("Option --all cannot be used together with --my-runs.")
    if run_id is not None and args.arg_run_id is not None:
        raise ConfigError("Specify a run either using --run-id or as an argument but not both")
    run_id = run_id if run_id is not None else args.arg_run_id
    if args.group_by_run and args.group_by_tag:
        raise ConfigError("Option --group-by-tag cannot be used with --group-by-run")
    if args.flat and (args.group_by_run or args.group_by_tag):
        raise ConfigError("Option --flat cannot be used with any --group-by-* option")
    system: dict[str, Any] = {}
    every: dict[str, Any] = {}

    def add(run: Any) -> None:
        user, sys_tags = set(run.tags) - set(run.system_tags), set(run.system_tags)
        if args.group_by_run:
            every[run.pathspec] = user if args.hide_system_tags else user | sys_tags
            if not args.hide_system_tags:
                system[run.pathspec] = sys_tags
        elif args.group_by_tag:
            for t in user:
                every.setdefault(t, []).append(run.pathspec)
            for t in () if args.hide_system_tags else sys_tags:
                system.setdefault(t, []).append(run.pathspec)
        else:
            every.setdefault("_", set()).update(user if args.hide_system_tags else user | sys_tags)
            if not args.hide_system_tags:
                system.setdefault("_", set()).update(sys_tags)

    pathspecs = []
    if list_all or args.my_runs:
        namespace(f"user:{current_user()}" if args.my_runs else None)
        try:
            runs = list(Flow(flow).runs())
        except NotFound:
            raise ConfigError(f"Cannot list tags because the flow {flow} has never been run.") from None
    else:
        runs = [_run(flow, run_id, None)]
    for run in runs:
        add(run)
        pathspecs.append(run.pathspec)
    _header(flow, quiet)
    if not args.group_by_run and not args.group_by_tag:
        system = {",".join(pathspecs): system.get("_", set())}
        every = {",".join(pathspecs): every.get("_", set())}
    if args.flat:
        for tag in sorted(next(iter(every.values()))):
            _echo(tag, quiet)  # on stderr, as Metaflow's
        return 0
    _print_groups(system, every, args.group_by_tag, quiet)
    return 0
