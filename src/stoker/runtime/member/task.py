"""The one task entrypoint: run a step for a TaskSpec and write its manifest to the store.

It runs in its own process (forked locally, a job step on Slurm, a container on Batch), reads its inputs from
the blob store and never touches the metadata database.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from typing import Any

from stoker.errors import EXIT_PERMANENT, EXIT_PREEMPTED, StokerError, StoreError
from stoker.exitstatus import exit_code_for
from stoker.features.hooks import TaskHooks, hang_limit_s
from stoker.flow.current import ParallelInfo, current, graph_info
from stoker.flow.decorators import TaskContext
from stoker.flow.frames import ForeachFrame, frames_from_json
from stoker.flow.graph import FlowGraph
from stoker.flow.spec import FlowSpec, Inputs, _ArtifactView
from stoker.redact import redact_text
from stoker.runtime.member.flowhooks import bind_task_configs
from stoker.runtime.member.handover import hand_over
from stoker.runtime.member.watchdog import Watchdog
from stoker.runtime.spec import TaskSpec
from stoker.store.artifacts import load_artifact, save_artifact, unchanged_since_load
from stoker.store.blobs import BlobStore, open_store
from stoker.store.goodput import take_timings
from stoker.store.manifest import Manifest, exception_record, keep_recorded_cause, read_manifest, store_manifest
from stoker.store.metrics import task_env as metrics_task_env
from stoker.store.signing import seal


def _exception_text(exc: BaseException) -> tuple[str, str]:
    """(message, traceback) of ``exc`` with the values of secret parameters (``STOKER_SECRET_*``) as ``***``:
    what the manifest, the index and the log keep of a step's exception."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return redact_text(str(exc)), redact_text(tb)


def _install_run_inputs(flow_cls: type[FlowSpec]) -> None:
    """Parameters and Configs become read-only properties backed by artifacts."""
    for name in flow_cls._run_input_names():
        setattr(flow_cls, name, property(lambda self, n=name: FlowSpec.__getattr__(self, n)))


def _frames(foreach: list[ForeachFrame], store: BlobStore) -> list[ForeachFrame]:
    """Foreach frames that load their item for `self.input` when asked (the split's list is loaded once; a gang
    node's item is its index, see ForeachFrame.value)."""
    frames = []
    cache: dict[str, Any] = {}
    for f in foreach:
        if f.desc is not None:
            def value(f: ForeachFrame = f) -> Any:
                key = f"{f.step}/{f.var}"
                if key not in cache:
                    cache[key] = load_artifact(store, f.desc)
                v = cache[key]
                indexable = hasattr(v, "__getitem__") and not isinstance(v, dict)
                return v[f.index] if indexable else list(v)[f.index]
            f = f.with_value(value)
        frames.append(f)
    return frames


def run_task(flow_cls: type[FlowSpec], spec: TaskSpec, store: BlobStore | None = None,
             graph: FlowGraph | None = None) -> int:
    """Execute one task attempt; return the process exit code (0 when the manifest says ok).

    A forked task gets the scheduler's graph and store; a spawned one builds them from the spec. The step's
    decorators act through their hooks (stoker.features.hooks): started, the step's call decorated, post_step or
    exception, finished (before the manifest is stored).
    """
    store = store or open_store(spec.store_url or None)
    graph = graph or FlowGraph(flow_cls)
    node = graph[spec.step]
    func = getattr(flow_cls, spec.step)
    started = time.time()
    parents = [read_manifest(store, spec.flow, spec.run_id, i["step"], i["task_id"], i["attempt"])
               for i in spec.inputs]
    _install_run_inputs(flow_cls)
    tmp = tempfile.mkdtemp(prefix=f"stoker-{spec.step}-{spec.task_id}-")
    term_cleanup = _remove_on_sigterm(tmp)
    par = _set_current(flow_cls, spec, store, graph, tmp)
    ctx = TaskContext(spec=spec, flow_cls=flow_cls, func=func, node=node, store=store, tempdir=tmp, parallel=par)
    hooks = TaskHooks(ctx)
    hooks.started()
    ctx.flow, call, ctx.inputs = _step_call(flow_cls, spec, store, node, func, parents)
    call = hooks.decorate(call)
    _enable_faulthandler()  # a segfault leaves its Python traceback in the task's stderr
    ctx.manifest = manifest = spec.manifest_head(started)  # hooks see it as a dict (Manifest's item access)
    manifest.python_version = sys.version.split()[0]  # Metaflow's task metadata `python_version` (platform's)
    watch = Watchdog.start(store, spec, hang_limit_s(func), tmp)  # `stoker stacks`; a hung step stopped
    try:
        code = _run_step(ctx, hooks, manifest, call, graph)
    finally:
        if watch is not None:
            watch.stop()
    artifacts = dict(ctx.flow.__dict__["_inherited"])
    if code == 0:
        code = _save_artifacts(ctx, manifest, artifacts, parents)
    manifest.finish("ok" if code == 0 else "failed", artifacts)
    manifest.timings = take_timings()  # the start-up phases timed in this process (stoker.store.goodput)
    hooks.finished()  # never raises; also on failure
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        keep_recorded_cause(store, manifest)  # written after the driver's (a stopped gang node): its cause stays
        sealed = seal(store.url, store_manifest(store, manifest)[1])  # stored first: the store is the truth
    except (OSError, StoreError) as e:  # e.g. a full disk: one line in the task's log, not stoker's traceback
        print(_unrecorded(spec, store.url, e), file=sys.stderr, flush=True)
        shutil.rmtree(tmp, ignore_errors=True)
        return 1  # no manifest: the scheduler reports the attempt as failed without its record
    hand_over(sealed, ok=code == 0)  # a success: the scheduler may go on while this process exits
    shutil.rmtree(tmp, ignore_errors=True)  # current.tempdir lives as long as the task
    if term_cleanup:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return code


def _unrecorded(spec: TaskSpec, url: str, e: BaseException) -> str:
    """The one line of a task whose manifest could not be stored: what, why, and the fix."""
    fix = "" if isinstance(e, StoreError) else "; free space in the store (or make it writable)"  # it names its own
    return (f"error: task {spec.flow}/{spec.run_id}/{spec.step}/{spec.task_id} (attempt {spec.attempt}) ended, but "
            f"its record (the manifest) could not be written to the store {url}: {e}{fix}; then `resume` the run")


def _set_current(flow_cls: type[FlowSpec], spec: TaskSpec, store: BlobStore, graph: FlowGraph,
                 tmp: str) -> ParallelInfo:
    """`current` of the task and the variables its children inherit; returns `current.parallel`."""
    par = ParallelInfo(**spec.parallel.to_dict()) if spec.parallel else ParallelInfo()
    current._set(flow_name=spec.flow, run_id=spec.run_id, step_name=spec.step, task_id=spec.task_id,
                 retry_count=spec.attempt, origin_run_id=spec.origin_run_id, is_running_flow=True,
                 username=spec.user, tags=set(spec.tags), tempdir=tmp, parallel=par,
                 namespace=f"user:{spec.user}", store_url=store.url, max_attempts=spec.max_attempts,
                 parameter_names=sorted(flow_cls._run_input_names()),  # as Metaflow: Configs too
                 graph=lambda: graph_info(graph, flow_cls.__doc__))
    if spec.parallel:
        current._set(is_parallel=True)
    # the trainer in this task's children (a launcher's ranks) streams its metrics into this attempt's series
    os.environ.update(metrics_task_env(store.url, spec.flow, spec.run_id, spec.step, spec.task_id, spec.attempt))
    if spec.parallel:
        os.environ.update(MF_PARALLEL_MAIN_IP=str(par.main_ip), MF_PARALLEL_NUM_NODES=str(par.num_nodes),
                          MF_PARALLEL_NODE_INDEX=str(par.node_index),
                          MF_PARALLEL_CONTROL_TASK_ID=str(par.control_task_id))
    return par


def _step_call(flow_cls: type[FlowSpec], spec: TaskSpec, store: BlobStore, node: Any, func: Any,
               parents: list[dict]) -> tuple[FlowSpec, Any, Inputs | None]:
    """The FlowSpec instance the step runs on (its inputs loaded lazily), the step's call and a join's inputs."""
    def loader_of(m: dict | None) -> Any:  # a parent's artifacts are named by its task in a refusal
        where = f"{m['flow']}/{m['run_id']}/{m['step']}/{m['task_id']}" if m else None
        return lambda desc, name: load_artifact(store, desc, name=name, pathspec=where)

    loader = loader_of(parents[0] if len(parents) == 1 else None)
    if node.is_join:
        inherited = dict(spec.run_inputs)
        views = [_ArtifactView(m["artifacts"], loader_of(m), step=m["step"],
                               foreach=_frames(frames_from_json(m.get("foreach_stack")), store))
                 for m in parents]
        flow = flow_cls._task_instance(inherited, loader, spec.step, _frames(spec.foreach, store), is_join=True)
        inputs = Inputs(views)
        return flow, lambda: func(flow, inputs), inputs
    inherited = dict(parents[0]["artifacts"]) if parents else {}
    inherited.update(spec.run_inputs)
    flow = flow_cls._task_instance(inherited, loader, spec.step, _frames(spec.foreach, store), is_join=False)
    return flow, lambda: func(flow), None


def _run_step(ctx: TaskContext, hooks: TaskHooks, manifest: Manifest, call: Any, graph: FlowGraph) -> int:
    """Run the step; on an exception, print it and let the decorators handle it, else record it in the
    manifest. Returns the exit code so far."""
    spec = ctx.spec
    try:
        call()
        hooks.post_step()
        worker = spec.parallel is not None and spec.parallel.node_index > 0
        manifest.next = _check_transition(ctx.flow, ctx.node, graph, gang_worker=worker)
        return 0
    except BaseException as exc:  # noqa: BLE001 - the task reports every failure in its manifest
        exit_code = exit_code_for(exc)  # 75: preempted (run again, resuming), 78: permanent (never again)
        permanent, preempted = exit_code == EXIT_PERMANENT, exit_code == EXIT_PREEMPTED
        ctx.last_attempt = (spec.attempt + 1 >= spec.max_attempts or permanent) and not preempted
        message, trace = _exception_text(exc)
        stopped = isinstance(exc, SystemExit) and isinstance(exc.code, int) and exc.code > 128  # the engine's stop
        if (permanent or preempted) and isinstance(exc, StokerError):  # one line: what to fix, or an expected stop
            print(f"{type(exc).__name__}: {message}", file=sys.stderr)
        elif stopped:
            print(f"stoker: the step was stopped ({_signal_name(exc.code - 128)}, exit {exc.code})", file=sys.stderr)
        else:
            print(trace, end="", file=sys.stderr)  # traceback.print_exc(), redacted
        if hooks.exception(exc):  # the flow goes on
            return 0
        flags = {"permanent": True} if permanent else {}
        if preempted:
            flags.update(preempted=True, resume_step=getattr(exc, "step", None))
        manifest.exception = exception_record(type(exc).__name__, message, trace, **flags)
        return exit_code if permanent or preempted else 1


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _save_artifacts(ctx: TaskContext, manifest: Manifest, artifacts: dict[str, dict], parents: list[dict]) -> int:
    """Store the step's new artifacts into `artifacts`, and the inherited ones it read and changed in place (an
    unchanged one keeps its parent's descriptor: nothing is stored); 1 (and the manifest says why) when that fails."""
    flow, store = ctx.flow, ctx.store
    try:
        for name, value in flow._new_artifacts().items():
            artifacts[name] = save_artifact(store, value, name=name)
        for name, (value, desc) in flow._read_inherited().items():
            if not unchanged_since_load(store, value, desc):
                artifacts[name] = save_artifact(store, value, name=name)
        var = (manifest.next or {}).get("foreach_var")
        if var and var not in artifacts:  # a foreach over a class attribute: its children need it stored
            artifacts[var] = save_artifact(store, getattr(flow, var), name=var)
        _add_constants(ctx.flow_cls, artifacts, parents, store)
        return 0
    except Exception as exc:  # noqa: BLE001
        message, trace = _exception_text(exc)
        print(trace, end="", file=sys.stderr)
        manifest.exception = exception_record(type(exc).__name__, f"saving artifacts failed: {message}", trace)
        return 1


def preload(flow_cls: type[FlowSpec] | None = None) -> None:
    """Import what :func:`run_task` imports on first use (the hooks of every task: ~10 ms) and find the temp folder
    (``gettempdir`` writes a probe file), in a fork server before it forks its members: once, instead of once per
    task."""
    import faulthandler  # noqa: F401

    from stoker._hashing import preferred_algo
    from stoker.features.hooks import preload as preload_hooks

    preload_hooks(flow_cls)
    preferred_algo()  # imports blake3 (a compiled module: ~1 ms a task otherwise)
    tempfile.gettempdir()


def _enable_faulthandler() -> None:
    import faulthandler

    try:
        faulthandler.enable(file=sys.stderr, all_threads=True)
    except (AttributeError, ValueError, OSError):  # a stderr without a file descriptor (a test's capture)
        pass


def _add_constants(flow_cls: type[FlowSpec], artifacts: dict[str, dict], parents: list[dict],
                   store: BlobStore) -> None:
    """Class-level constants are artifacts of every task, as in Metaflow (`run.data.LIMIT`): the start task
    stores them, a join carries them over from its first input; one that cannot be stored is left out."""
    for name in flow_cls._constant_names():
        if name in artifacts:
            continue
        desc = next((m["artifacts"][name] for m in parents if name in (m.get("artifacts") or {})), None)
        if desc is None and not parents:
            try:
                desc = save_artifact(store, getattr(flow_cls, name), name=name)
            except Exception:  # noqa: BLE001 - e.g. a lock or a client object: readable in steps, not stored
                continue
        if desc is not None:
            artifacts[name] = desc


def _remove_on_sigterm(path: str) -> bool:
    """A task stopped by SIGTERM (a gang's fail-fast, a cancel) still dies by that signal, but without leaving
    its temp folder behind. Only where nobody else handles SIGTERM (a task process, not a scheduler)."""
    import threading

    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return False

    def on_term(signum: int, frame: Any) -> None:
        shutil.rmtree(path, ignore_errors=True)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    return True


def _check_transition(flow: FlowSpec, node: Any, graph: FlowGraph, gang_worker: bool = False) -> dict[str, Any]:
    """The step's self.next() must match the graph; returns what the scheduler needs to launch successors. A gang's
    worker node (node_index > 0) may return without calling it, as in Metaflow: node 0's call is the step's."""
    t = flow.__dict__["_transition"]
    if t is None and gang_worker and node.kind != "end":
        return {"steps": list(node.out_funcs)}
    if node.kind == "end":
        if t is not None:
            raise StokerError("the end step must not call self.next()")
        return {"steps": []}
    if t is None:
        raise StokerError(f"step {node.name} did not call self.next() (it must be the last statement)")
    if node.kind == "switch":  # the chosen case: one of the steps the source names
        if t.get("condition") is None or len(t["steps"]) != 1 or t["steps"][0] not in node.out_funcs:
            raise StokerError(f"step {node.name} is a switch in its source but called self.next("
                              f"{', '.join(t['steps'])}); call self.next({{...}}, condition={node.condition!r}) once")
        return {"steps": t["steps"], "condition": t["condition"]}
    if t.get("condition") is not None or t["steps"] != node.out_funcs:
        raise StokerError(f"step {node.name} called self.next({', '.join(t['steps'])}) but its source says "
                          f"self.next({', '.join(node.out_funcs)}); self.next must be static")
    out: dict[str, Any] = {"steps": t["steps"]}
    if node.kind == "foreach":
        var = node.foreach_var
        try:
            value = getattr(flow, var)
        except AttributeError:
            raise StokerError(f"foreach={var!r} in step {node.name}: self.{var} was never assigned; assign "
                              f"a list before self.next()") from None
        try:
            n = len(value)
        except TypeError:
            raise StokerError(f"foreach={var!r} in step {node.name}: self.{var} is a {type(value).__name__}, "
                              f"which has no len(); use a list or tuple") from None
        if n == 0:
            raise StokerError(f"foreach={var!r} in step {node.name}: self.{var} is empty; a foreach needs at "
                              f"least one item")
        out.update(foreach_var=var, num_splits=n)
    if node.kind == "parallel":
        n = t["num_parallel"]
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise StokerError(f"num_parallel={n!r} in step {node.name} must be a positive int")
        out.update(num_parallel=n)
    return out


def main_from_cli(flow_cls: type[FlowSpec], spec_path: str, with_specs: list[str] | None = None) -> int:
    """`python flow.py _task SPEC.json`: the subprocess form of the entrypoint (Slurm, Batch, spawn)."""
    from stoker.flow.decorators import apply_with

    try:
        with open(spec_path, encoding="utf-8") as f:
            spec = TaskSpec.from_json(f.read())
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:  # JSON, UTF-8: ValueErrors
        sys.exit(f"error: _task {spec_path}: not a task spec the scheduler wrote ({type(e).__name__}: "
                 f"{str(e)[:200]}); `_task` is stoker's internal command: run the flow with "
                 f"`python {os.path.basename(sys.argv[0]) or 'flow.py'} run`")
    apply_with(flow_cls, spec.with_decorators)
    bind_task_configs(flow_cls, spec)  # config values in decorators and the mutators, as in the run
    return run_task(flow_cls, spec)



# artifacts stored before stoker.features existed pickled these classes under this module's name
_MOVED = {"CaughtException": "stoker.features.catch", "FailureHandledByCatch": "stoker.features.catch",
          "StepTimeout": "stoker.features.timeout"}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        import importlib

        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
