"""Start, resume and inspect runs of a flow class: resolve run inputs, lint, register the run, schedule it."""

from __future__ import annotations

import inspect
import json
import os
import signal
import socket
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stoker.distributed.accel import nproc_problem, step_request
from stoker.errors import ConfigError, StokerError
from stoker.flow.decorators import apply_with, get_decorator
from stoker.flow.graph import FlowGraph
from stoker.flow.lint import lint
from stoker.flow.parameters import _MISSING, Config, ParameterContext
from stoker.redact import REDACTED, redact_with_spec
from stoker.runtime.contract import Backend, JobRef, Unit
from stoker.runtime.driver.failures import FIX_AND_RERUN
from stoker.runtime.driver.jobs import build_unit
from stoker.runtime.driver.output import Display
from stoker.runtime.driver.queue import frames_key
from stoker.runtime.driver.scheduler import Router, RunResult, Scheduler
from stoker.runtime.member.flowhooks import bind_default_configs, bind_run
from stoker.runtime.package import stage_package
from stoker.runtime.spec import TaskSpec
from stoker.store.artifacts import save_artifact, secret_descriptor
from stoker.store.blobs import BlobStore, open_store
from stoker.store.manifest import list_manifests, read_manifest_object, read_run_record, write_run_record
from stoker.store.metadata import MetadataDB
from stoker.store.paths import current_user, default_db_path, default_store_url, home_dir
from stoker.store.signing import finite_json, store_key


def new_run_id() -> str:
    return str(int(time.time() * 1_000_000))


def resolve_run_inputs(flow_cls: type, given: dict[str, Any], config_paths: dict[str, str],
                       overrides: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """Values of every Parameter, IncludeFile and Config for a run (errors name the flag and the fix)."""
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
    for attr, p in sorted(inputs.items(), key=lambda kv: not isinstance(kv[1], Config)):  # configs first
        if isinstance(p, Config):
            values[attr] = p.resolve(config_paths.get(p.name), by_cfg[p.name], base_dir)
        else:
            ctx = ParameterContext(flow_name=flow_cls.__name__, user_name=current_user(), parameter_name=p.name,
                                   configs={k: v for k, v in values.items() if isinstance(inputs[k], Config)})
            values[attr] = p.resolve(given.get(p.name, _MISSING), ctx)
    return values


def prepare_flow(flow_cls: type, with_specs: list[str]) -> FlowGraph:
    apply_with(flow_cls, with_specs)
    graph = FlowGraph(flow_cls)
    lint(graph, flow_cls._run_inputs())
    return graph


def _gang_size(n: Any, flow_cls: type, values: dict[str, Any] | None) -> Any:
    """num_parallel as written: a literal, or `self.PARAM` (the run's value, else the Parameter's default)."""
    if isinstance(n, str) and n.startswith("self.") and n[5:].isidentifier():
        attr = n[5:]
        if values and attr in values:
            v = values[attr]  # from the command line: the text, not yet converted by the Parameter
            return int(v) if isinstance(v, str) and v.strip().isdigit() else v
        p = flow_cls._run_inputs().get(attr)
        default = getattr(p, "default", None)
        return default if isinstance(default, int) else None
    return n


def plan_units(graph: FlowGraph, flow_cls: type, router: Router, store_url: str,
               values: dict[str, Any] | None = None) -> list[tuple[Backend, Unit]]:
    """One representative unit per step (a gang at its num_parallel size when that is a literal or a
    parameter), with placeholder task ids: what `--dry-run` prints and what each backend checks before
    anything is submitted."""
    out = []
    for node in graph:
        backend = router(node.name)
        parent = graph[node.in_funcs[0]] if node.in_funcs else None
        n = _gang_size(parent.num_parallel, flow_cls, values) if parent is not None and parent.kind == "parallel" \
            else None
        size = n if isinstance(n, int) and n > 0 else 1
        kind = "gang" if parent is not None and parent.kind == "parallel" else "task"
        specs = [TaskSpec(flow=graph.name, run_id="RUN", step=node.name, task_id=f"T{i}", store_url=store_url,
                          parallel={"main_ip": None, "num_nodes": size, "node_index": i, "port": None,
                                    "control_task_id": "T0"} if kind == "gang" else None) for i in range(size)]
        unit = build_unit(flow_cls, backend, kind, specs, store_url)
        if backend.remote:
            unit.code_key, unit.spec_key, unit.flow_path = "CODE_PACKAGE_KEY", "SPEC_KEY", Path(graph.file).name
        out.append((backend, unit))
    return out


def check_units(graph: FlowGraph, flow_cls: type, planned: list[tuple[Backend, Unit]]) -> None:
    """Fail before anything starts when a step asks for what its backend cannot give."""
    for backend, unit in planned:
        tr = get_decorator(getattr(flow_cls, unit.step), "torchrun")
        if tr is not None and tr.attributes.get("nproc_per_node"):
            n = int(tr.attributes["nproc_per_node"])
            if problem := nproc_problem(n, step_request(unit.resources, unit.options)):
                raise ConfigError(f"{graph[unit.step].where()}: @torchrun(nproc_per_node={n}) on step "
                                  f"{unit.step}: {problem}")
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
            values: dict[str, Any] | None = None) -> str:
    """What each step would submit (the sbatch scripts, the Batch payloads ...), without any I/O. `values`: the
    parameters given on the command line (a gang sized by a parameter is shown at that size)."""
    graph = prepare_flow(flow_cls, list(with_specs or []))
    bind_default_configs(flow_cls, Path(inspect.getsourcefile(flow_cls) or ".").parent)
    store_url = default_store_url()
    parts = []
    for backend, unit in plan_units(graph, flow_cls, router, store_url, values):
        parts.append(f"# ---- step {unit.step}: {backend.name} ({unit.kind}, {unit.size} member(s)) ----\n"
                     + backend.materialize(unit).text)
    return "\n".join(parts)


def start_run(flow_cls: type, router: Router, *, params: dict[str, Any] | None = None,
              config_paths: dict[str, str] | None = None, overrides: dict[str, Any] | None = None,
              with_specs: list[str] | None = None, tags: list[str] | None = None, max_workers: int = 16,
              store: BlobStore | None = None, db: MetadataDB | None = None, run_id: str | None = None,
              origin_run_id: str | None = None, rerun_steps: set[str] | None = None, quiet: bool = False,
              run_id_file: str | None = None, on_submit: Callable[[JobRef, str, str], None] | None = None,
              project_options: dict[str, Any] | None = None) -> RunResult:
    """Run (or resume) a flow. `project_options`: @project's `branch` / `production` from the command line."""
    # long on purpose, until a run context replaces its parameters (issue 24): the run's set-up in the one order
    # its parts depend on each other (inputs, decorators, package, key, record, scheduler)
    with_specs = list(with_specs or [])
    graph = prepare_flow(flow_cls, with_specs)
    store = store or open_store()
    db = db or MetadataDB(default_db_path())
    user = current_user()
    flow_file = inspect.getsourcefile(flow_cls) or ""
    origin: dict[tuple, dict] = {}
    if origin_run_id:
        origin, stored = load_origin(store, db, graph.name, origin_run_id)
        values = stored
    else:
        values = resolve_run_inputs(flow_cls, params or {}, config_paths or {}, overrides or {},
                                    Path(flow_file).parent)
    # config values into decorators (`@retry(times=cfg.n)`), then @project's system tags
    project = bind_run(flow_cls, values, user, project_options, graph.name)
    system_tags = project.tags if project else []
    planned = plan_units(graph, flow_cls, router, store.url, values)
    check_units(graph, flow_cls, planned)
    # the code package, built before anything runs (a package that cannot be built fails now, not mid-run)
    package = stage_package(store, flow_file) if any(b.remote for b, _ in planned) else None
    run_id = run_id or new_run_id()
    store_key(store.url, create=True)  # the store's signing key (kept outside the store), made on first use
    declared = flow_cls._run_inputs()
    run_inputs = save_run_inputs(store, declared, values)
    early = _bind_backends(flow_cls, graph, router, store)  # a fork server preloads while the run is registered
    try:
        shown = {k: (REDACTED if _is_secret(declared[k]) else v if _jsonable(v) else repr(v))
                 for k, v in values.items() if not isinstance(declared[k], Config)}
        configs = {k: finite_json(dict(v)) for k, v in values.items() if isinstance(declared[k], Config)}
        db.create_run(graph.name, run_id, user=user, tags=tags or [], params=shown, config=configs or None,
                      origin_run_id=origin_run_id, system_tags=system_tags)
        record = {"flow": graph.name, "run_id": run_id, "user": user, "params": shown, "config": configs,
                  "run_inputs": run_inputs, "origin_run_id": origin_run_id, "tags": tags or [],
                  "system_tags": system_tags,
                  "with": [redact_with_spec(w) for w in with_specs],
                  "flow_file": flow_file, "created_at": time.time(), "status": "running",
                  "pid": os.getpid(), "host": socket.gethostname(),
                  "graph": {n.name: list(n.out_funcs) for n in graph}}  # the DAG, for readers without the flow file
        write_run_record(store, record)
        if run_id_file:
            Path(run_id_file).write_text(run_id)
        display = Display(f"{graph.name}/{run_id}", quiet=quiet)
        display.info(f"stoker: run {graph.name}/{run_id} started (user:{user}, store {store.url})"
                     + (f", resuming {origin_run_id}" if origin_run_id else ""), style="bold")
        if project:  # as Metaflow prints it
            display.info(f"Project: {project.project_name}, Branch: {project.branch_name}")
        # a task's spec: the system tags first, so that a user tag `project:x` is not taken for @project's
        sched = Scheduler(flow_cls=flow_cls, graph=graph, run_id=run_id, store=store, db=db, router=router,
                          run_inputs=run_inputs, user=user, tags=[*system_tags, *(tags or [])], max_workers=max_workers,
                          origin=origin,
                          origin_run_id=origin_run_id, rerun_steps=rerun_steps, flow_file=flow_file,
                          with_specs=with_specs, display=display, log_root=home_dir() / "logs", on_submit=on_submit,
                          package=package)
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
        _finish_record(store, db, record, "failed")
        raise
    finally:
        if old_hup is not None:
            signal.signal(signal.SIGHUP, old_hup)
        for b in early:
            if b not in sched.backends.values():  # never used (stopped before its first pass): the scheduler did
                b.close()  # not close it
    _finish_record(store, db, record, result.status)
    elapsed = time.time() - started
    if result.status == "succeeded":
        display.info(f"stoker: run {graph.name}/{run_id} succeeded in {elapsed:.1f} s", style="bold green")
    else:
        for f in result.failures:
            display.info(f, style="red")
        fix = result.failures and all(FIX_AND_RERUN in f for f in result.failures)  # resume would fail alike
        display.info(f"stoker: run {graph.name}/{run_id} {result.status} after {elapsed:.1f} s; " + (
                     "fix the error above and run again" if fix else
                     f"continue it with `python {_as_invoked(flow_file)} resume {run_id}`"), style="bold red")
    return result


def _bind_backends(flow_cls: type, graph: FlowGraph, router: Router, store: BlobStore) -> list[Backend]:
    """Give each backend the run uses the in-process task entrypoint (a backend that forks members calls it) and
    have the one that runs `start` get ready now (the local fork server: forked and preloading while the run is
    registered); the backends it started, which the caller closes if the run fails before its scheduler runs."""
    from stoker.runtime.member.task import preload, run_task

    used = {router(n.name).name: router(n.name) for n in graph}
    for b in used.values():
        b.bind(lambda spec: run_task(flow_cls, spec, store, graph), preload)  # for a backend that forks members
    first = router("start")
    start_early = getattr(first, "start_early", None)
    if start_early is None:
        return []
    start_early()
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
    """The final status goes to the store (the truth) and to the index."""
    now = time.time()
    write_run_record(store, {**record, "status": status, "finished_at": now})
    db.set_run_status(record["flow"], record["run_id"], status, finished_at=now)


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
        key = (m["step"], frames_key(m.get("foreach_stack") or []), tuple(m.get("iteration") or ()))
        if key not in origin or m["attempt"] > origin[key]["attempt"]:
            origin[key] = m
    return origin, values


def latest_run_id(db: MetadataDB, flow: str) -> str:
    run = db.latest_run(flow)
    if run is None:
        raise StokerError(f"flow {flow} has no runs to resume; start one with `run`")
    return run.run_id
