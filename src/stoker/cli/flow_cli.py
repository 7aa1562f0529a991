"""`python flow.py COMMAND`: run, resume, check, show, logs (and the internal `_task`)."""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
import os
import sys
from pathlib import Path
from typing import Any

from stoker._process import end_program
from stoker.cli.argtypes import number_at_least, positive_int
from stoker.cli.errors import run_cli
from stoker.cli.guardian import start_guardian
from stoker.cli.top_options import split_top_options
from stoker.errors import ConfigError
from stoker.flow.decorators import get_flow_decorator
from stoker.flow.graph import FlowGraph
from stoker.flow.lint import lint
from stoker.flow.parameters import (
    _MISSING,
    Config,
    ConfigText,
    IncludeFile,
    parameters_from_env,
    parse_override_value,
)

COMPAT_FLAGS = ("--no-pylint", "--pylint")  # accepted for Metaflow scripts; stoker's check always runs
COMPAT_OPTIONS = ("--datastore", "--metadata", "--environment", "--datastore-root", "--event-logger", "--monitor")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--with", dest="with_", action="append", default=[], metavar="DECO[:k=v,...]",
                   help="attach a decorator to every step, e.g. retry:times=2")
    p.add_argument("--tag", action="append", default=[], help="tag the run (repeatable); user:, project: and "
                   "project_branch: are system tags' prefixes, refused")
    p.add_argument("--max-workers", type=positive_int, default=16, help="most tasks running at once, at least 1 "
                   "(default 16)")
    p.add_argument("--max-num-splits", type=positive_int, default=10000, help="accepted for Metaflow compatibility")
    p.add_argument("--run-id-file", help="write the run id to this file")
    p.add_argument("--runner-attribute-file", help="write the run's flow name, id and metadata location as JSON "
                   "to this file (used by the Runner API, as in Metaflow)")
    p.add_argument("--quiet", action="store_true", help="print only the run's start and end")
    p.add_argument("--backend", default="local", help="where steps without a backend decorator run: local "
                   "(default), slurm, batch, or NAME=STEP,STEP for only those steps")
    p.add_argument("--dry-run", action="store_true", help="print what each step would submit (sbatch scripts "
                   "...) and exit")
    p.add_argument("--no-preflight", action="store_true", help="skip the node checks a @torchrun gang runs "
                   "before its command (devices, EFA, imports, data, disk, an all_reduce); sets STOKER_PREFLIGHT=0 "
                   "for the run's tasks")
    p.add_argument("--hang-timeout", type=number_at_least(0), default=None, metavar="SECONDS",
                   help="stop a gang or @torchrun step whose task and ranks print nothing for this long, its stacks "
                   "recorded, cause hang (default 1800; 0: off; a step's @timeout(hang=S) wins)")
    p.add_argument("--smoke", action="store_true", help="a smoke run of the same flow: gangs on at most 2 nodes, "
                   "about 20 training steps with a checkpoint, then stop; prints what the full run costs per hour")


def build_parser(flow_cls: type) -> argparse.ArgumentParser:
    name = os.path.basename(sys.argv[0]) or "flow.py"
    ap = argparse.ArgumentParser(prog=f"python {name}", description=(flow_cls.__doc__ or "").strip() or None)
    ap.add_argument("--with", dest="global_with", action="append", default=[], help=argparse.SUPPRESS)
    if get_flow_decorator(flow_cls, "project") is not None:  # as Metaflow: top-level options of @project
        # as Metaflow's click options (auto_envvar_prefix METAFLOW): $METAFLOW_PRODUCTION / $METAFLOW_BRANCH give
        # the defaults (_project_options)
        ap.add_argument("--production", action="store_true", default=False,
                        help="use the @project's production branch (a custom one: --branch); "
                        "default: $METAFLOW_PRODUCTION")
        ap.add_argument("--branch", default=None, help="use the given branch "
                        "name under @project (default: $METAFLOW_BRANCH, else user.<username> unless --production)")
    sub = ap.add_subparsers(dest="command", metavar="{run,resume,check,show,logs,dump,tag}")
    run = sub.add_parser("run", help="run the flow")
    _common(run)
    run.add_argument("--config", nargs="+", action="append", default=[], metavar="[NAME] PATH",
                     help="a TOML/JSON file for the flow's Config (NAME when it has several)")
    run.add_argument("--config-value", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                     help="the flow's Config NAME given as its value (JSON, or the text its parser reads) in place "
                     "of a file, as Metaflow's; default: $METAFLOW_FLOW_CONFIG_VALUE (a JSON object {NAME: VALUE})")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override one config value, e.g. --set train.lr=3e-4")
    for p in flow_cls._run_inputs().values():
        if isinstance(p, Config):
            continue
        kind = "file" if isinstance(p, IncludeFile) else getattr(p.type, "__name__", getattr(p.type, "name", ""))
        shown = p.show_default and p.default is not _MISSING and not getattr(p, "secret", False)  # never a secret
        help_ = f"{p.help} ({kind}" + (f", default {p.default!r})" if shown else ")")
        names = [f"--{p.cli_name}"] + ([f"--{p.name}"] if p.name != p.cli_name else [])  # Metaflow: verbatim
        if p.type is bool:
            run.add_argument(*names, dest=f"param__{p.name}", nargs="?", const="true", help=help_)
            run.add_argument(f"--no-{p.cli_name}", dest=f"param__{p.name}", action="store_const", const="false",
                             help=argparse.SUPPRESS)
        else:
            run.add_argument(*names, dest=f"param__{p.name}", help=help_)
    res = sub.add_parser("resume", help="re-run a failed run from its failed steps, reusing what succeeded")
    res.add_argument("run_id", nargs="?", help="the run to resume (default: the latest run), or, as in Metaflow, "
                     "a step to run again from")
    res.add_argument("--origin-run-id", dest="origin", help="same as RUN_ID (Metaflow's spelling)")
    res.add_argument("--step", help="run this step and everything after it again, even if it succeeded")
    _common(res)
    sub.add_parser("check", help="check the flow's graph and print 'valid'")
    sub.add_parser("show", help="print the flow's steps and transitions")
    from stoker.cli import dump, logs, tag  # Metaflow's client commands: logs, dump, tag

    for module in (logs, dump, tag):
        module.add_parser(sub)
    tk = sub.add_parser("_task", help=argparse.SUPPRESS)
    tk.add_argument("spec")
    return ap


COMMANDS = ("run", "resume", "check", "show", "logs", "dump", "tag", "_task")


TOP_CONFIG = ("--config", "--config-value")  # Metaflow's top-level options; stoker's are `run`'s


def _move_top_config(argv: list[str]) -> list[str]:
    """Metaflow's `python flow.py --config NAME PATH --config-value NAME VALUE run ...` -> `run --config NAME PATH
    --config-value NAME VALUE ...` (`--config-value` takes two values; `--config` [NAME] PATH)."""
    cmd = next((j for j, a in enumerate(argv) if a in COMMANDS), None)
    if cmd is None or not any(a in TOP_CONFIG for a in argv[:cmd]):
        return argv
    before: list[str] = []
    moved: list[str] = []
    i = 0
    while i < cmd:
        if argv[i] in TOP_CONFIG:
            n = 2 if argv[i] == "--config-value" else \
                len(list(itertools.takewhile(lambda a: not a.startswith("--"), argv[i + 1:min(cmd, i + 3)])))
            moved += argv[i:i + 1 + n]
            i += 1 + n
        else:
            before.append(argv[i])
            i += 1
    return before + argv[cmd:cmd + 1] + moved + argv[cmd + 1:]


def _split_compat(argv: list[str], keep: frozenset[str] = frozenset()) -> list[str]:
    """Drop Metaflow's top-level flags left after the command and refuse its top-level options there (Metaflow
    refuses both), except `keep`: the flow's own parameter options (a Parameter("environment") is
    `run --environment VALUE`, as in Metaflow)."""
    argv = _move_top_config(argv)
    out = []
    for a in argv:
        if a.split("=")[0] in keep:
            out.append(a)
            continue
        if a in COMPAT_FLAGS:
            continue
        if (name := a.split("=")[0]) in COMPAT_OPTIONS:  # as Metaflow, not after the command (it did nothing there)
            raise ConfigError(f"{name} is an option of the flow, not of the command: put it before the command, "
                              f"e.g. `python {Path(sys.argv[0]).name} {name} VALUE run ...`")
        out.append(a)
    return out


def main_program(flow_cls: type) -> Any:
    """`MyFlow()` at the bottom of a flow file: the command line of sys.argv. When the flow file is this process's
    program (`python flow.py ...`: no debugger, profiler, `runpy` wrapper or `python -i` waiting for it to end), the
    process then ends without the interpreter's teardown (_process.end_program)."""
    if not _is_the_program(flow_cls):
        return main(flow_cls)
    try:
        return main(flow_cls)
    except SystemExit as e:
        end_program(e.code)


def _is_the_program(flow_cls: type) -> bool:
    """Whether the flow file is what Python was started to run: its class in __main__, and the outermost frame of
    the stack the module code of __main__ itself (under `python -m cProfile|pdb flow.py` or `runpy.run_path` it is
    the runner's, which has work to do after the flow ends)."""
    if flow_cls.__module__ != "__main__" or sys.flags.inspect or sys.gettrace() is not None:
        return False
    frame = sys._getframe()
    while frame.f_back is not None:
        frame = frame.f_back
    main_module = sys.modules.get("__main__")
    return frame.f_code.co_name == "<module>" and frame.f_globals is getattr(main_module, "__dict__", None) \
        and frame.f_globals.get(flow_cls.__name__) is flow_cls


def main(flow_cls: type, argv: list[str] | None = None) -> Any:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_task"]:
        if len(argv) != 2 or not os.path.isfile(argv[1]):  # internal: the scheduler gives a spec file it wrote
            sys.exit(f"error: _task takes the path of a task spec file, which the scheduler writes; got "
                     f"{' '.join(argv[1:]) or 'none'}")
        from stoker.runtime.member.task import main_from_cli

        sys.exit(main_from_cli(flow_cls, argv[1]))
    try:  # Metaflow's options before the command: accepted, or refused saying what stoker uses instead
        argv, top = split_top_options(argv, COMMANDS)
        top.apply()
        argv = _split_compat(argv, _param_options(flow_cls))
    except ConfigError as e:
        return run_cli(lambda e=e: _raise(e))
    args = build_parser(flow_cls).parse_args(argv)
    if top.quiet and hasattr(args, "quiet"):
        args.quiet = True
    return run_cli(lambda: dispatch(flow_cls, _checked(args)))


def _checked(args: argparse.Namespace) -> argparse.Namespace:
    """`args` once what argparse cannot see is checked, before anything starts: the tags (no system tag's prefix,
    no control character) and the user they are made as ($STOKER_USER ...)."""
    if args.command in ("run", "resume"):
        from stoker.store.paths import current_user
        from stoker.store.tags import check_user_tags

        check_user_tags(args.tag, user=current_user())
    return args


def _param_options(flow_cls: type) -> frozenset[str]:
    """`--name` (and `--no-name`) of every Parameter of the flow."""
    names = set()
    for p in flow_cls._run_inputs().values():
        if not isinstance(p, Config):
            names |= {f"--{p.cli_name}", f"--{p.name}", f"--no-{p.cli_name}"}
    return frozenset(names)


def _raise(e: BaseException) -> Any:
    raise e


def _configs(raw: list[list[str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in raw:
        if len(item) == 1:
            out["__single__"] = item[0]
        elif len(item) == 2:
            out[item[0]] = item[1]
        else:
            raise ConfigError("--config takes PATH or NAME PATH")
    return out


def _env_configs(what: str) -> dict[str, str]:
    """$STOKER_FLOW_<what> or $METAFLOW_FLOW_<what> (a JSON object {config name: path or value}, as Metaflow's
    click reads it): {name: path or value text}."""
    for var in (f"STOKER_FLOW_{what}", f"METAFLOW_FLOW_{what}"):
        raw = os.environ.get(var)
        if not raw:
            continue
        try:
            loaded = json.loads(raw)
        except json.JSONDecodeError as e:
            loaded = e
        if not isinstance(loaded, dict):
            raise ConfigError(f"${var} must be a JSON object {{config name: {what.lower().replace('_', ' ')}}}, "
                              f"e.g. '{{\"config\": {{\"lr\": 0.1}}}}'; got {raw[:80]!r}: fix it or unset it")
        return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in loaded.items()}
    return {}


def _run_configs(flow_cls: type, raw: list[list[str]], raw_values: list[list[str]] = ()) -> dict[str, str]:
    """`--config [NAME] PATH` and `--config-value NAME VALUE` (else, as in Metaflow, $METAFLOW_FLOW_CONFIG and
    $METAFLOW_FLOW_CONFIG_VALUE) as {config name: path, or the value as a ConfigText}, every file checked to exist
    before anything is created (no store, no run record): a missing file is one message naming it and where it was
    looked for."""
    cfg_names = [p.name for p in flow_cls._run_inputs().values() if isinstance(p, Config)]
    configs = _configs(raw) or (_env_configs("CONFIG") if cfg_names else {})
    values = {name: ConfigText(v) for name, v in raw_values} or \
        ({k: ConfigText(v) for k, v in _env_configs("CONFIG_VALUE").items()} if cfg_names else {})
    if both := sorted(set(configs) & set(values)):
        raise ConfigError(f"config {', '.join(both)}: given both a file (--config) and a value (--config-value); "
                          "give one of them")
    if "__single__" in configs:
        if len(cfg_names) != 1:
            raise ConfigError("--config PATH needs the flow to have exactly one Config; use --config NAME PATH "
                              f"(configs: {', '.join(cfg_names) or 'none'})")
        configs[cfg_names[0]] = configs.pop("__single__")
    base = Path(inspect.getsourcefile(flow_cls) or sys.argv[0]).resolve().parent
    for name, path in configs.items():
        if name not in cfg_names:
            continue  # start_run names the unknown config
        p = Path(path)
        where = [p] if p.is_absolute() else [Path.cwd() / p, base / p]  # as Config.resolve looks
        if not any(c.is_file() for c in where):
            raise ConfigError(f"--config {path}: no such file (looked for {' and '.join(map(str, where))}); "
                              "pass the path of an existing TOML or JSON file")
    return {**configs, **values}


def _overrides(raw: list[str]) -> dict[str, Any]:
    out = {}
    for item in raw:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ConfigError(f"--set {item}: expected KEY=VALUE, e.g. --set train.lr=3e-4")
        out[key.strip()] = parse_override_value(value.strip())
    return out


def _env_flag(var: str) -> bool:
    """A boolean top-level option's value from the environment, read as Metaflow's click reads it."""
    value = os.environ.get(var)
    if value is None:
        return False
    if value.lower() in ("true", "t", "1", "yes", "y"):
        return True
    if value.lower() in ("false", "f", "0", "no", "n"):
        return False
    raise ConfigError(f"${var}={value!r} is not a valid boolean: set it to true or false (or unset it)")


def _project_options(args: argparse.Namespace) -> dict[str, Any]:
    """@project's `--branch` / `--production` (top-level options, present only for a flow with @project)."""
    if not hasattr(args, "branch"):
        return {"branch": None, "production": False}
    # read when the flow starts, so a flow file may set them before its class
    return {"branch": args.branch if args.branch is not None else os.environ.get("METAFLOW_BRANCH") or None,
            "production": bool(args.production) or _env_flag("METAFLOW_PRODUCTION")}


def _given_params(flow_cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """`run`'s parameter values: the command line's, else STOKER_PARAM_<NAME> / METAFLOW_RUN_<NAME>."""
    given = {k[len("param__"):]: v for k, v in vars(args).items() if k.startswith("param__") and v is not None}
    if args.command != "run":
        return given
    return {**parameters_from_env(flow_cls._run_inputs(), given), **given}


def dispatch(flow_cls: type, args: argparse.Namespace) -> int:
    from stoker.backends import StepRouter
    from stoker.runtime.driver.context import RunRequest
    from stoker.runtime.driver.launch import dry_run, latest_run_id, start_run

    if args.command in (None, "check", "show"):
        graph = FlowGraph(flow_cls)
        lint(graph, flow_cls._run_inputs())
        if args.command == "show":
            print_graph(graph)
        else:
            print(f"flow {graph.name} is valid: {len(graph.nodes)} steps")
        if args.command is None:
            print("commands: run, resume, check, show, logs, dump, tag (python flow.py COMMAND --help)")
        return 0
    if args.command in ("logs", "dump", "tag"):
        from stoker.cli.logs import client_command

        return client_command(flow_cls.__name__, args)
    configs = _run_configs(flow_cls, list(args.config), list(args.config_value)) if args.command == "run" else {}
    with_specs = list(args.global_with) + list(args.with_)
    router = StepRouter(flow_cls, default=args.backend, flow_file=sys.argv[0])
    if args.dry_run:
        resolved = (configs, _overrides(args.set)) if args.command == "run" else (None, None)
        print(dry_run(flow_cls, router, with_specs, _given_params(flow_cls, args), *resolved), end="")
        return 0
    if args.no_preflight:  # the tasks inherit it (local), or get it from the backend (sbatch, Batch overrides)
        os.environ["STOKER_PREFLIGHT"] = "0"
    if args.smoke:
        from stoker.distributed import smoke

        os.environ[smoke.ENV] = "1"
    guard = start_guardian(flow_cls.__name__)
    if args.command == "run":
        params = _given_params(flow_cls, args)
        request = RunRequest(params=params, config_paths=configs, overrides=_overrides(args.set))
    else:
        from stoker.store.metadata import MetadataDB
        from stoker.store.paths import default_db_path

        graph = FlowGraph(flow_cls)
        if args.run_id and args.run_id in graph and not args.step:  # Metaflow's `resume STEP`
            args.step, args.run_id = args.run_id, None
        origin = args.run_id or args.origin or latest_run_id(MetadataDB(default_db_path()), flow_cls.__name__)
        rerun: set[str] = set()
        if args.step:
            if args.step not in graph:
                raise ConfigError(f"resume --step {args.step}: the flow has no such step ({', '.join(graph.nodes)})")
            rerun = graph.reachable_from(args.step)
        request = RunRequest(origin_run_id=origin, rerun_steps=rerun)
    request.with_specs, request.tags, request.max_workers = with_specs, list(args.tag or []), args.max_workers
    request.run_id_file, request.quiet, request.on_submit = args.run_id_file, args.quiet, guard
    request.hang_timeout_s = args.hang_timeout
    request.run_id, request.project_options = _runner_run_id(args, flow_cls), _project_options(args)
    request.resume_options = ([f"--backend={args.backend}"] if args.backend != "local" else []) + [
        f"--with={w}" for w in with_specs] + ([f"--hang-timeout={args.hang_timeout:g}"]
                                              if args.hang_timeout is not None else [])
    result = start_run(flow_cls, router, request)
    guard.done()
    if args.smoke:
        from stoker.cli.smoke_report import print_smoke_report

        print_smoke_report(flow_cls.__name__, result)
    return {"succeeded": 0, "killed": 130}.get(result.status, 1)


def _runner_run_id(args: argparse.Namespace, flow_cls: type) -> str | None:
    """With --runner-attribute-file: the run id chosen and written there for the Runner; else None. (The Runner
    API's package imports asyncio: ~20 ms that a plain `run` does not pay.)"""
    if not args.runner_attribute_file:
        return None
    from stoker.runner.attributes import write_runner_attributes

    return write_runner_attributes(args.runner_attribute_file, flow_cls.__name__)


def print_graph(graph: FlowGraph) -> None:
    from rich.console import Console
    from rich.text import Text

    c = Console(highlight=False)
    c.print(Text(f"{graph.name}  ({graph.file})", style="bold"))
    if graph.doc:  # as Metaflow's `show`: the flow's docstring, then each step's, whole
        c.print(Text(f"\n{graph.doc}"))
    for node in graph:
        decos = " ".join(repr(d) for d in node.decorators)
        head = Text(f"\nStep {node.name}", style="bold cyan")
        if decos:
            head.append(f"  {decos}", style="dim")
        c.print(head)
        if node.doc:
            c.print(Text("\n".join(f"    {line}".rstrip() for line in node.doc.strip().splitlines()), style="italic"))
        if node.kind == "end":
            c.print("    => (end)")
        elif node.kind == "foreach":
            c.print(f"    => {node.out_funcs[0]}  (foreach {node.foreach_var})")
        elif node.kind == "parallel":
            c.print(f"    => {node.out_funcs[0]}  (gang of {node.num_parallel})")
        else:
            c.print(f"    => {', '.join(node.out_funcs)}")
