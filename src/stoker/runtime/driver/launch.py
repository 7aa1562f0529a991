"""Start, resume and inspect runs of a flow class: resolve run inputs, lint, register the run, schedule it."""

from __future__ import annotations

import inspect
import json
import os
import shlex
import signal
import socket
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stoker.errors import ConfigError, StokerError, StoreError
from stoker.features.hooks import plan_problems
from stoker.flow.configs import ConfigValue, config_values_by_name
from stoker.flow.current import current
from stoker.flow.decorators import apply_with
from stoker.flow.frames import frames_from_json
from stoker.flow.graph import FlowGraph
from stoker.flow.lint import lint
from stoker.flow.mutables import has_user_decorators
from stoker.flow.parameters import _MISSING, Config, Parameter, ParameterContext, gang_size
from stoker.flow.presubmit import run_presubmit_checks
from stoker.redact import REDACTED, redact_with_spec
from stoker.runtime.contract import Backend, InProcessBackend, Unit
from stoker.runtime.driver.context import Router, RunContext, RunRequest
from stoker.runtime.driver.failures import FIX_AND_RERUN
from stoker.runtime.driver.jobs import build_unit
from stoker.runtime.driver.output import Display
from stoker.runtime.driver.queue import frames_key
from stoker.runtime.driver.scheduler import RunResult, Scheduler
from stoker.runtime.member.flowhooks import bind_default_configs, bind_run
from stoker.runtime.package import stage_package
from stoker.runtime.spec import GangSlot, TaskSpec
from stoker.store.artifacts import save_artifact, secret_descriptor, short_repr
from stoker.store.blobs import BlobStore, open_store
from stoker.store.manifest import list_manifests, read_manifest_object, read_run_record, write_run_record
from stoker.store.metadata import MetadataDB
from stoker.store.paths import current_user, default_db_path, default_store_url, home_dir
from stoker.store.signing import finite_json, store_key
from stoker.store.tags import check_user_tags


def new_run_id() -> str:
    return str(int(time.time() * 1_000_000))


def resolve_run_inputs(flow_cls: type, given: dict[str, Any], config_paths: dict[str, str],
                       overrides: dict[str, Any], base_dir: Path,
                       project_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Values of every Parameter, IncludeFile and Config for a run (errors name the flag and the fix).

    As in Metaflow, the Configs come first (a Config's default function gets a context without configs), then
    the decorators are bound to them and, while the Parameters' default functions run, `current` has the run's
    @project names (`project_options`: the --branch / --production options) and `ctx.configs` the Configs."""
    values: dict[str, Any] = {}
    inputs = flow_cls._run_inputs()
    configs = {k: v for k, v in inputs.items() if isinstance(v, Config)}
    unknown = set(config_paths) - {c.name for c in configs.values()}
    if unknown:
        raise ConfigError(f"--config {', '.join(sorted(unknown))}: the flow has no such Config "
                          f"(it has {', '.join(c.name for c in configs.values()) or 'none'})")
    by_cfg: dict[str, dict[str, Any]] = {c.name: {} for c in configs.values()}
    for dotted, value in overrides.items():
        head, _, rest = dotted.partition(".")
        if head in by_cfg and rest:
            by_cfg[head][rest] = value
        elif len(by_cfg) == 1:
            by_cfg[next(iter(by_cfg))][dotted] = value
        else:
            raise ConfigError(f"--set {dotted}: start the key with the config name "
                              f"({', '.join(by_cfg) or 'the flow has no Config'})")
    for attr, p in inputs.items():
        if isinstance(p, Config):
            ctx = ParameterContext(flow_name=flow_cls.__name__, user_name=current_user(), parameter_name=p.name)
            values[attr] = p.resolve(config_paths.get(p.name), by_cfg[p.name], base_dir, ctx)
    if has_user_decorators(flow_cls):  # its mutators run now (bind_run), and may add Parameters
        bind_run(flow_cls, values, current_user(), project_options, flow_cls.__name__)
    params = {attr: p for attr, p in flow_cls._run_inputs().items() if not isinstance(p, Config)}
    if not params:
        return values
    configs = ConfigValue(config_values_by_name(flow_cls, values))
    project = bind_run(flow_cls, values, current_user(), project_options, flow_cls.__name__)
    saved = dict(current._values)
    current._set(**(project.as_current() if project else {}))
    try:
        for attr, p in params.items():
            ctx = ParameterContext(flow_name=flow_cls.__name__, user_name=current_user(), parameter_name=p.name,
                                   configs=configs)
            values[attr] = p.resolve(given.get(p.name, _MISSING), ctx)
    finally:
        current._clear()
        current._set(**saved)
    return values


def prepare_flow(flow_cls: type, with_specs: list[str]) -> FlowGraph:
    apply_with(flow_cls, with_specs)
    return _checked_graph(flow_cls)


def _checked_graph(flow_cls: type) -> FlowGraph:
    graph = FlowGraph(flow_cls)
    lint(graph, flow_cls._run_inputs())
    return graph


def plan_units(graph: FlowGraph, flow_cls: type, router: Router, store_url: str,
               values: dict[str, Any] | None = None) -> list[tuple[Backend, Unit]]:
    """One representative unit per step (a gang at its num_parallel size when that is a literal or a
    parameter: `values` are the run's, by attribute, as the Parameters converted them), with placeholder task
    ids: what `--dry-run` prints and what each backend checks before anything is submitted."""
    out = []
    params = flow_cls._run_inputs()
    for node in graph:
        backend = router(node.name)
        parent = graph[node.in_funcs[0]] if node.in_funcs else None
        gang = parent is not None and parent.kind == "parallel"
        slots = GangSlot.gang(gang_size(parent.num_parallel, params, values) or 1, "T0") if gang else [None]
        specs = [TaskSpec(flow=graph.name, run_id="RUN", step=node.name, task_id=f"T{i}", store_url=store_url,
                          parallel=slot) for i, slot in enumerate(slots)]
        kind = "gang" if gang else "task"
        unit = build_unit(flow_cls, backend, kind, specs, store_url)
        if backend.remote:
            unit.code_key, unit.spec_key, unit.flow_path = "CODE_PACKAGE_KEY", "SPEC_KEY", Path(graph.file).name
        out.append((backend, unit))
    return out


def check_units(graph: FlowGraph, flow_cls: type, planned: list[tuple[Backend, Unit]],
                values: dict[str, Any] | None = None) -> None:
    """Fail before anything starts when the flow's @presubmit checks refuse the run's inputs (`values`, by
    attribute), or a step asks for what its backend cannot give."""
    if values is not None:
        run_presubmit_checks(flow_cls, values)
    for backend, unit in planned:
        for problem in plan_problems(getattr(flow_cls, unit.step), unit.resources, unit.options):
            raise ConfigError(f"{graph[unit.step].where()}: step {unit.step}: {problem}")
        if backend.remote:
            backend.check(unit)
            continue
        caps = backend.capabilities()
        node, a = graph[unit.step], unit.resources
        if a.get("gpu") and a["gpu"] > caps.gpus:
            raise ConfigError(f"{node.where()}: @resources(gpu={a['gpu']:g}) on step {node.name}, but the "
                              f"{backend.name} backend has {caps.gpus} GPU(s): lower gpu= or run on a cluster "
                              f"backend (--with slurm / @batch)")
        if a.get("trainium") and a["trainium"] > caps.trainium:
            raise ConfigError(f"{node.where()}: @resources(trainium={a['trainium']:g}) on step {node.name}, but "
                              f"the {backend.name} backend has no Trainium devices: run it with @batch on a trn "
                              f"instance type")


def dry_run(flow_cls: type, router: Router, with_specs: list[str] | None = None,
            values: dict[str, Any] | None = None, config_paths: dict[str, str] | None = None,
            overrides: dict[str, Any] | None = None) -> str:
    """What each step would submit (the sbatch scripts, the Batch payloads ...), once every check the run makes
    before submitting passed (`check_units`: the steps' plan_problem hooks, each backend's `check`, which may read
    the engine, e.g. Batch's queue; nothing is submitted or stored). `values`: the
    parameters given on the command line, by name, as typed (a gang sized by a parameter is shown at that size).
    With `config_paths` / `overrides` (a `run`), every input is resolved and checked as the run would, configs
    bound into the decorators; without (a `resume`), only the given parameters are converted."""
    graph = prepare_flow(flow_cls, list(with_specs or []))
    base_dir = Path(inspect.getsourcefile(flow_cls) or ".").parent
    store_url = default_store_url()
    given = values or {}
    if config_paths is not None or overrides is not None:
        converted = resolve_run_inputs(flow_cls, given, config_paths or {}, overrides or {}, base_dir)
        bind_run(flow_cls, converted, current_user(), None, graph.name)
        if has_user_decorators(flow_cls):
            graph = _checked_graph(flow_cls)
    else:
        bind_default_configs(flow_cls, base_dir)
        converted = {attr: p.convert(given[p.name]) for attr, p in flow_cls._run_inputs().items()
                     if isinstance(p, Parameter) and p.name in given}  # as a run converts them
    parts = []
    planned = plan_units(graph, flow_cls, router, store_url, converted)
    # what the run would refuse, refused here too (as start_run does); a resume's inputs are the origin's
    check_units(graph, flow_cls, planned, converted if config_paths is not None or overrides is not None else None)
    for backend, unit in planned:
        parts.append(f"# ---- step {unit.step}: {backend.name} ({unit.kind}, {unit.size} member(s)) ----\n"
                     + backend.materialize(unit).text)
    return "\n".join(parts)


def start_run(flow_cls: type, router: Router, request: RunRequest | None = None, **options: Any) -> RunResult:
    """Run (or resume) a flow: a `RunRequest`, or its fields as keywords."""
    req = request or RunRequest(**options)
    ctx, record, project = _set_up(flow_cls, router, req)
    early = _bind_backends(flow_cls, ctx.graph, router, ctx.store)  # a fork server preloads while the run registers
    try:
        _register(ctx, record)
        if req.run_id_file:
            Path(req.run_id_file).write_text(ctx.run_id)
        display = Display(f"{ctx.flow}/{ctx.run_id}", quiet=req.quiet)
        display.info(f"stoker: run {ctx.flow}/{ctx.run_id} started (user:{ctx.user}, store {ctx.store.url})"
                     + (f", resuming {ctx.origin_run_id}" if ctx.origin_run_id else ""), style="bold")
        if project:  # as Metaflow prints it
            display.info(f"Project: {project.project_name}, Branch: {project.branch_name}")
        sched = Scheduler(ctx, max_workers=req.max_workers, display=display, log_root=home_dir() / "logs",
                          on_submit=req.on_submit)
    except BaseException:
        for b in early:
            b.close()  # it forked no member yet: its fork server stops
        raise
    started = time.time()
    # a closed terminal (SIGHUP) stops the run like Ctrl-C: tasks stopped, the run marked killed
    old_hup = signal.signal(signal.SIGHUP, _on_hangup(sched)) if hasattr(signal, "SIGHUP") else None
    try:
        result = sched.run()
    except BaseException:
        sched._stop_all("the scheduler failed")  # never leave tasks running behind a crashed scheduler
        _finish_record(ctx.store, ctx.db, record, "failed")
        raise
    finally:
        if old_hup is not None:
            signal.signal(signal.SIGHUP, old_hup)
        for b in early:
            if b not in sched.backends.values():  # never used (stopped before its first pass): the scheduler did
                b.close()  # not close it
    _finish_record(ctx.store, ctx.db, record, result.status)
    _say_how_it_ended(display, ctx, result, time.time() - started, req.resume_options)
    for deco in getattr(flow_cls, "_stoker_flow_decorators", ()):  # the run is over: its flow's hooks (@exit_hook)
        deco.run_finished(ctx.flow_file, f"{ctx.flow}/{ctx.run_id}", result.status == "succeeded")
    return result


def _set_up(flow_cls: type, router: Router, req: RunRequest) -> tuple[RunContext, dict, Any]:
    """The run's set-up, in the one order its parts depend on each other: inputs, decorators bound to them, the
    plan checked, the code package, the store's key, the inputs saved; the run's record (not yet written)."""
    graph = prepare_flow(flow_cls, req.with_specs)
    store = req.store or open_store()
    db = req.db or MetadataDB(default_db_path())
    user = current_user()
    flow_file = inspect.getsourcefile(flow_cls) or ""
    origin: dict[tuple, dict] = {}
    if req.origin_run_id:
        origin, values = load_origin(store, db, graph.name, req.origin_run_id)
    else:
        values = resolve_run_inputs(flow_cls, req.params, req.config_paths, req.overrides, Path(flow_file).parent,
                                    req.project_options)
    # the mutators, config values into decorators (`@retry(times=cfg.n)`), then @project's system tags
    project = bind_run(flow_cls, values, user, req.project_options, graph.name)
    if has_user_decorators(flow_cls):  # mutators may have changed the steps' decorators
        graph = _checked_graph(flow_cls)
    system_tags = project.tags if project else []
    check_user_tags(req.tags, user=user, system=system_tags)  # `user:x`, `project:x` are stoker's to set
    if req.max_workers < 1:
        raise ConfigError(f"max_workers={req.max_workers}: at least 1 task must be able to run at once")
    planned = plan_units(graph, flow_cls, router, store.url, values)
    check_units(graph, flow_cls, planned, values)
    # the code package, built before anything runs (a package that cannot be built fails now, not mid-run)
    package = stage_package(store, flow_file) if any(b.remote for b, _ in planned) else None
    run_id = req.run_id or new_run_id()
    store_key(store.url, create=True)  # the store's signing key (kept outside the store), made on first use
    declared = flow_cls._run_inputs()
    run_inputs = save_run_inputs(store, declared, values)
    ctx = RunContext(flow_cls=flow_cls, graph=graph, run_id=run_id, store=store, db=db, router=router,
                     run_inputs=run_inputs, user=user, tags=[*system_tags, *req.tags], origin=origin,
                     origin_run_id=req.origin_run_id, rerun_steps=set(req.rerun_steps), flow_file=flow_file,
                     with_specs=list(req.with_specs), package=package, hang_timeout_s=req.hang_timeout_s)
    shown = {k: (REDACTED if _is_secret(declared[k]) else _shown(v))
             for k, v in values.items() if not isinstance(declared[k], Config)}
    configs = {k: finite_json(dict(v)) for k, v in values.items() if isinstance(declared[k], Config)}
    record = {"flow": graph.name, "run_id": run_id, "user": user, "params": shown, "config": configs,
              "run_inputs": run_inputs, "origin_run_id": req.origin_run_id, "tags": list(req.tags),
              "system_tags": system_tags, "with": [redact_with_spec(w) for w in req.with_specs],
              "resume_options": _shown_options(req.resume_options),
              "flow_file": flow_file, "created_at": time.time(), "status": "running",
              "pid": os.getpid(), "host": socket.gethostname(),
              "graph": {n.name: list(n.out_funcs) for n in graph}}  # the DAG, for readers without the flow file
    return ctx, record, project


def _register(ctx: RunContext, record: dict) -> None:
    """The run's record into the store (the truth), then into the index: a store that cannot take it (a full disk)
    leaves no `running` row behind."""
    try:
        write_run_record(ctx.store, record)
    except OSError as e:
        raise StoreError(f"cannot write the record of run {ctx.flow}/{ctx.run_id} to the store {ctx.store.url}: "
                         f"{e.strerror or e}; nothing ran: free space (or fix the store's permissions) and run again"
                         ) from e
    ctx.db.create_run(ctx.flow, ctx.run_id, user=ctx.user, tags=record["tags"], params=record["params"],
                      config=record["config"] or None, origin_run_id=ctx.origin_run_id,
                      system_tags=record["system_tags"])


def _say_how_it_ended(display: Display, ctx: RunContext, result: RunResult, elapsed: float,
                      resume_options: list[str]) -> None:
    if result.status == "succeeded":
        display.info(f"stoker: run {ctx.flow}/{ctx.run_id} succeeded in {elapsed:.1f} s", style="bold green")
        return
    for f in result.failures:
        display.info(f, style="red")
    fix = result.failures and all(FIX_AND_RERUN in f for f in result.failures)  # resume would fail alike
    display.info(f"stoker: run {ctx.flow}/{ctx.run_id} {result.status} after {elapsed:.1f} s; " + (
                 "fix the error above and run again" if fix else
                 f"continue it with `{resume_command(ctx.flow_file, ctx.run_id, _shown_options(resume_options))}`"),
                 style="bold red")


def _shown_options(options: list[str]) -> list[str]:
    """`--with=environment:vars=...` keeps only the variables' names where it is stored or printed."""
    return [f"--with={redact_with_spec(o[7:])}" if o.startswith("--with=") else o for o in options]


def resume_command(flow_file: str, run_id: str, options: list[str]) -> str:
    """The command that continues the run where it ended, with the options it ran with (a run on Slurm resumed
    without `--backend slurm` would train the gang on this machine)."""
    return shlex.join(["python", _as_invoked(flow_file), "resume", *options, run_id])


def _bind_backends(flow_cls: type, graph: FlowGraph, router: Router, store: BlobStore) -> list[Backend]:
    """Give each backend the run uses the in-process task entrypoint (a backend that forks members calls it) and
    have the one that runs `start` get ready now (the local fork server: forked and preloading while the run is
    registered); the backends it started, which the caller closes if the run fails before its scheduler runs."""
    from stoker.runtime.member.task import preload, run_task

    used = {router(n.name).name: router(n.name) for n in graph}
    for b in used.values():
        if isinstance(b, InProcessBackend):  # it forks members: they run this entrypoint
            b.bind(lambda spec: run_task(flow_cls, spec, store, graph), lambda: preload(flow_cls))
    first = router("start")
    if not isinstance(first, InProcessBackend):
        return []
    first.start_early()
    return [first]


def _on_hangup(sched: Scheduler) -> Callable[[int, Any], None]:
    def on_hangup(signum: int, frame: Any) -> None:
        _detach_from_terminal()
        sched._on_sigint(signum, frame)  # the scheduler's loop stops every task, as on Ctrl-C

    return on_hangup


def _detach_from_terminal() -> None:
    """The terminal is gone: a write to it fails (EIO) and would end the run half-stopped, so output that went
    to it goes to /dev/null from now on. (A hung-up terminal is no longer a tty to isatty(); it still is a
    character device, while a pipe or a log file is kept.)"""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            try:
                if stat.S_ISCHR(os.fstat(fd).st_mode):
                    os.dup2(null, fd)
            except OSError:
                pass
    finally:
        os.close(null)


def _as_invoked(flow_file: str) -> str:
    """The script the user ran (``sys.argv[0]``, e.g. a wrapper of a packaged flow), else the flow file,
    as it can be typed from here (relative to the current folder when inside it)."""
    script = sys.argv[0] if sys.argv and sys.argv[0].endswith(".py") and os.path.isfile(sys.argv[0]) else flow_file
    path = os.path.abspath(script)
    relative = os.path.relpath(path)
    return relative if not relative.startswith("..") else path


def _finish_record(store: BlobStore, db: MetadataDB, record: dict, status: str) -> None:
    """The final status goes to the store (the truth) and to the index, each tried whatever became of the other; a
    failure is one StoreError saying how the run ended and how to go on (runtime/driver/finish.py)."""
    from stoker.runtime.driver.finish import record_end

    record_end(store, db, record, status)


def _is_secret(p: Any) -> bool:
    return bool(getattr(p, "secret", False))


def save_run_inputs(store: BlobStore, declared: dict[str, Any], values: dict[str, Any]) -> dict[str, dict]:
    """Descriptors of the run inputs. A secret parameter's value is not stored: it goes into this process's
    environment (``STOKER_SECRET_<NAME>``), which the run's local tasks inherit (docs/store.md, "Security")."""
    out: dict[str, dict] = {}
    for k, v in values.items():
        if not _is_secret(declared[k]):
            out[k] = save_artifact(store, v, name=k)
            continue
        if not _jsonable(v):
            raise ConfigError(f"parameter --{declared[k].cli_name} is secret=True, so its value must be a plain "
                              f"JSON value (a string, number, list or dict), not {type(v).__name__}")
        out[k], env, encoded = secret_descriptor(k, v)
        os.environ[env] = encoded
    return out


SHOWN_MAX = 4096  # a parameter's value longer than this (an IncludeFile's contents) is shown as a short repr


def _shown(v: Any) -> Any:
    """A parameter's value as the run record and the index show it (its artifact holds the value): itself when it
    is short plain JSON, else a short repr and its size (a 64 MB IncludeFile in the record cost minutes of JSON)."""
    n = len(v) if isinstance(v, str | bytes | bytearray) else 0
    if n <= SHOWN_MAX and _jsonable(v):
        return v
    return short_repr(v) + (f" ({n} {'characters' if isinstance(v, str) else 'bytes'})" if n else "")


def _jsonable(v: Any) -> bool:
    """Whether ``v`` is plain JSON (NaN and infinities are not: signed documents are strict JSON)."""
    try:
        json.dumps(v, allow_nan=False)
        return True
    except (TypeError, ValueError):
        return False


def load_origin(store: BlobStore, db: MetadataDB, flow: str, run_id: str) -> tuple[dict[tuple, dict], dict]:
    """Successful task manifests of the origin run keyed by (step, foreach position, pass of each recursive
    switch), and its run inputs."""
    from stoker.store.artifacts import load_artifact

    info = read_run_record(store, flow, run_id)
    if info is None or "run_inputs" not in info:
        raise StokerError(f"run {flow}/{run_id} is not in the store {store.url}: pick a run id from `stoker runs "
                          f"{flow}`")
    values = {k: load_artifact(store, d) for k, d in info["run_inputs"].items()}
    origin: dict[tuple, dict] = {}
    for mname in list_manifests(store, flow, run_id):
        m = read_manifest_object(store, mname)  # signature verified: its artifacts are reused as they are
        if m.get("status") != "ok":
            continue
        key = (m["step"], frames_key(frames_from_json(m.get("foreach_stack"))), tuple(m.get("iteration") or ()))
        if key not in origin or m["attempt"] > origin[key]["attempt"]:
            origin[key] = m
    return origin, values


def latest_run_id(db: MetadataDB, flow: str) -> str:
    run = db.latest_run(flow)
    if run is None:
        raise StokerError(f"flow {flow} has no runs to resume; start one with `run`")
    return run.run_id
