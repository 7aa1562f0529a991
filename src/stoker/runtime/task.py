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

from ..errors import EXIT_PERMANENT, EXIT_PREEMPTED, StokerError
from ..exitstatus import exit_code_for
from ..flow.current import ParallelInfo, current, graph_info
from ..flow.decorators import get_decorator
from ..flow.graph import FlowGraph
from ..flow.spec import FlowSpec, Inputs, _ArtifactView
from ..monitor.task_hook import start_for_task
from ..redact import redact_text
from ..store.artifacts import load_artifact, save_artifact
from ..store.blob import BlobStore, open_store
from ..store.manifest import read_manifest, store_manifest
from ..store.metrics import task_env as metrics_task_env
from ..store.signing import seal
from .flowhooks import after_task, bind_task_configs, task_current, with_secrets
from .handover import hand_over
from .spec import TaskSpec


class StepTimeout(StokerError):
    """The step ran longer than its @timeout."""


class FailureHandledByCatch(StokerError):
    """What @catch stores when a task's attempts kept dying without an exception of its code (as Metaflow)."""

    def __init__(self, retry_count: int) -> None:
        super().__init__(f"Task execution kept failing over {retry_count} attempts. Your code did not raise an "
                         f"exception. Something in the execution environment caused the failure.")


class CaughtException:
    """What @catch(var=...) stores: the exception's type, message and traceback as text (picklable)."""

    def __init__(self, exc: BaseException) -> None:
        self.type = f"{type(exc).__module__}.{type(exc).__name__}"
        self.message, self.traceback = _exception_text(exc)  # an artifact: no secret parameter's value in it

    exception = property(lambda self: self.message)  # Metaflow's MetaflowExceptionWrapper fields
    stacktrace = property(lambda self: self.traceback)

    def __repr__(self) -> str:
        return f"CaughtException({self.type}: {self.message})"

    __str__ = __repr__


def _exception_text(exc: BaseException) -> tuple[str, str]:
    """(message, traceback) of ``exc`` with the values of secret parameters (``STOKER_SECRET_*``) as ``***``:
    what the manifest, the index, the log and @catch keep of a step's exception."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return redact_text(str(exc)), redact_text(tb)


def _install_run_inputs(flow_cls: type[FlowSpec]) -> None:
    """Parameters and Configs become read-only properties backed by artifacts."""
    for name in flow_cls._run_input_names():
        setattr(flow_cls, name, property(lambda self, n=name: FlowSpec.__getattr__(self, n)))


def _frames(foreach: list[dict], store: BlobStore) -> list[dict]:
    """Foreach frames with a lazy `value_fn` for `self.input` (the split's list is loaded once)."""
    frames = []
    cache: dict[str, Any] = {}
    for f in foreach:
        frame = {"step": f["step"], "index": f["index"], "num_splits": f["num_splits"]}
        if f.get("var") is None and f.get("desc") is None:  # a num_parallel gang: as Metaflow, self.input is the
            frame.update(value=f["index"], num_splits=None)  # node index and foreach_stack() has no split count
        elif f.get("desc") is not None:
            def value(f=f) -> Any:
                key = f["step"] + "/" + f["var"]
                if key not in cache:
                    cache[key] = load_artifact(store, f["desc"])
                v = cache[key]
                indexable = hasattr(v, "__getitem__") and not isinstance(v, dict)
                return v[f["index"]] if indexable else list(v)[f["index"]]
            frame["value_fn"] = value
        frames.append(frame)
    return frames


def run_task(flow_cls: type[FlowSpec], spec: TaskSpec, store: BlobStore | None = None,
             graph: FlowGraph | None = None) -> int:
    """Execute one task attempt; return the process exit code (0 when the manifest says ok).

    A forked task gets the scheduler's graph and store; a spawned one builds them from the spec.
    """
    store = store or open_store(spec.store_url or None)
    graph = graph or FlowGraph(flow_cls)
    node = graph[spec.step]
    func = getattr(flow_cls, spec.step)
    started = time.time()
    loader = lambda desc: load_artifact(store, desc)  # noqa: E731
    parents = [read_manifest(store, spec.flow, spec.run_id, i["step"], i["task_id"], i["attempt"])
               for i in spec.inputs]
    _install_run_inputs(flow_cls)
    tmp = tempfile.mkdtemp(prefix=f"stoker-{spec.step}-{spec.task_id}-")
    term_cleanup = _remove_on_sigterm(tmp)
    par = ParallelInfo(**spec.parallel) if spec.parallel else ParallelInfo()
    current._set(flow_name=spec.flow, run_id=spec.run_id, step_name=spec.step, task_id=spec.task_id,
                 retry_count=spec.attempt, origin_run_id=spec.origin_run_id, is_running_flow=True,
                 username=spec.user, tags=_user_tags(flow_cls, spec.tags), tempdir=tmp, parallel=par,
                 namespace=f"user:{spec.user}", store_url=store.url, max_attempts=spec.max_attempts,
                 parameter_names=sorted(flow_cls._run_input_names()),  # as Metaflow: Configs too
                 graph=lambda: graph_info(graph, flow_cls.__doc__))
    if spec.parallel:
        current._set(is_parallel=True)
    current._set(**task_current(flow_cls, spec))  # @project: project_name, branch_name, ...
    # the trainer in this task's (torchrun) children streams its metrics into this attempt's series
    os.environ.update(metrics_task_env(store.url, spec.flow, spec.run_id, spec.step, spec.task_id, spec.attempt))
    if spec.parallel:
        os.environ.update(MF_PARALLEL_MAIN_IP=str(par.main_ip), MF_PARALLEL_NUM_NODES=str(par.num_nodes),
                          MF_PARALLEL_NODE_INDEX=str(par.node_index), MF_PARALLEL_CONTROL_TASK_ID=str(par.control_task_id))
    env = get_decorator(func, "environment")
    if env:
        os.environ.update(env.attributes["vars"])
    if get_decorator(func, "torchrun"):
        from .torchrun import TorchrunHelper

        current._set(torch=TorchrunHelper.for_task(func, par))

    if node.is_join:
        inherited = dict(spec.run_inputs)
        views = [_ArtifactView(m["artifacts"], loader, step=m["step"],
                               foreach=_frames(m.get("foreach_stack") or [], store))
                 for m in parents]
        flow = flow_cls._task_instance(inherited, loader, spec.step, _frames(spec.foreach, store), is_join=True)
        call = lambda: func(flow, Inputs(views))  # noqa: E731
    else:
        inherited = dict(parents[0]["artifacts"]) if parents else {}
        inherited.update(spec.run_inputs)
        flow = flow_cls._task_instance(inherited, loader, spec.step, _frames(spec.foreach, store), is_join=False)
        call = lambda: func(flow)  # noqa: E731

    call = with_secrets(func, call)  # @secrets: fetched just before the step, never stored
    if get_decorator(func, "catch") and spec.attempt >= spec.max_attempts:  # @catch's fallback attempt
        def call() -> None:
            raise FailureHandledByCatch(spec.attempt)
    _enable_faulthandler()  # a segfault leaves its Python traceback in the task's stderr
    manifest: dict[str, Any] = spec.manifest_head(started)
    code = 0
    monitor = start_for_task(func, store, flow=spec.flow, run_id=spec.run_id, step=spec.step, task_id=spec.task_id,
                             attempt=spec.attempt, node=par.node_index)  # @monitor: never fails the task
    from ..cards.runtime import start_task_cards

    cards = start_task_cards(func, spec, store)  # @card: current.card now; the final cards before the manifest
    try:
        with _timeout(func):
            call()
        catch = get_decorator(func, "catch")
        if catch and catch.attributes["var"] and catch.attributes["var"] not in flow.__dict__:
            object.__setattr__(flow, catch.attributes["var"], None)  # as Metaflow: None when nothing failed
        manifest["next"] = _check_transition(flow, node, graph)
    except BaseException as exc:  # noqa: BLE001 - the task reports every failure in its manifest
        catch = get_decorator(func, "catch")
        exit_code = exit_code_for(exc)  # 75: preempted (retry and resume), 78: permanent (never retried)
        permanent, preempted = exit_code == EXIT_PERMANENT, exit_code == EXIT_PREEMPTED
        last_attempt = (spec.attempt + 1 >= spec.max_attempts or permanent) and not preempted
        message, trace = _exception_text(exc)
        if permanent and isinstance(exc, StokerError):  # one line: the error says what to fix
            print(f"{type(exc).__name__}: {message}", file=sys.stderr)
        else:
            print(trace, end="", file=sys.stderr)  # traceback.print_exc(), without secrets
        if catch and last_attempt and not isinstance(exc, KeyboardInterrupt) and node.kind not in ("foreach",
                                                                                                    "parallel", "switch"):
            var = catch.attributes["var"]
            if var:
                object.__setattr__(flow, var, CaughtException(exc))
            manifest["catch_var"] = var
            manifest["next"] = {"steps": list(node.out_funcs)}
            print(f"@catch: step {spec.step} failed ({type(exc).__name__}: {message}); the flow continues"
                  + (f" with the exception in self.{var}" if var else ""), file=sys.stderr)
        else:
            manifest["exception"] = {"type": type(exc).__name__, "message": message, "traceback": trace}
            if permanent:
                manifest["exception"]["permanent"] = True
            if preempted:
                manifest["exception"].update(preempted=True, resume_step=getattr(exc, "step", None))
            code = exit_code if permanent or preempted else 1
    artifacts = {k: v for k, v in flow.__dict__["_inherited"].items()}
    if code == 0:
        try:
            for name, value in flow._new_artifacts().items():
                artifacts[name] = save_artifact(store, value, name=name)
            var = (manifest.get("next") or {}).get("foreach_var")
            if var and var not in artifacts:  # a foreach over a class attribute: its children need it stored
                artifacts[var] = save_artifact(store, getattr(flow, var), name=var)
            _add_constants(flow_cls, artifacts, parents, store)
        except Exception as exc:  # noqa: BLE001
            message, trace = _exception_text(exc)
            print(trace, end="", file=sys.stderr)
            manifest["exception"] = {"type": type(exc).__name__, "message": f"saving artifacts failed: {message}",
                                     "traceback": trace}
            code = 1
    monitor.stop()  # the last samples land before the manifest says the attempt is over
    manifest.update(status="ok" if code == 0 else "failed", finished_at=time.time(), artifacts=artifacts)
    manifest.setdefault("exception", None)
    cards.finish(artifacts, manifest)  # never raises; also on failure
    sys.stdout.flush()
    sys.stderr.flush()
    hand_over(seal(store.url, store_manifest(store, manifest)[1]))  # stored first: the store is the truth
    after_task()
    shutil.rmtree(tmp, ignore_errors=True)  # current.tempdir lives as long as the task
    if term_cleanup:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return code


def preload() -> None:
    """Import what :func:`run_task` imports on first use (cards pull in ``platform``, ``uuid``, ``html``: ~10 ms)
    and find the temp folder (``gettempdir`` writes a probe file), in a fork server before it forks its members:
    once, instead of once per task."""
    import faulthandler  # noqa: F401

    from ..cards import runtime  # noqa: F401

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


def _user_tags(flow_cls: type[FlowSpec], tags: list[str]) -> set[str]:
    """`current.tags`, as Metaflow's: the run's user tags (`--tag`), not its system tags (@project's, which
    come first in a spec); a user's own `project:x` tag stays."""
    from ..flow.decorators import get_flow_decorator
    from ..flow.project import BRANCH_TAG, PROJECT_TAG

    rest = list(tags)
    if get_flow_decorator(flow_cls, "project") is not None:
        for prefix in (PROJECT_TAG, BRANCH_TAG):
            first = next((t for t in rest if t.startswith(prefix)), None)
            if first is not None:
                rest.remove(first)
    return set(rest)


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


def _check_transition(flow: FlowSpec, node: Any, graph: FlowGraph) -> dict[str, Any]:
    """The step's self.next() must match the graph; returns what the scheduler needs to launch successors."""
    t = flow.__dict__["_transition"]
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


class _timeout:
    """@timeout inside the task: SIGALRM raises StepTimeout so @retry and @catch can handle it."""

    def __init__(self, func: Any) -> None:
        d = get_decorator(func, "timeout")
        self.seconds = d.total_seconds if d else 0

    def __enter__(self) -> None:
        if self.seconds > 0:
            def fire(signum: int, frame: Any) -> None:
                raise StepTimeout(f"step timed out after {self.seconds:g} s (@timeout); raise the limit or "
                                  f"make the step faster")
            signal.signal(signal.SIGALRM, fire)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc: Any) -> None:
        if self.seconds > 0:
            signal.setitimer(signal.ITIMER_REAL, 0)


def main_from_cli(flow_cls: type[FlowSpec], spec_path: str, with_specs: list[str] | None = None) -> int:
    """`python flow.py _task SPEC.json`: the subprocess form of the entrypoint (Slurm, Batch, spawn)."""
    from ..flow.decorators import apply_with

    with open(spec_path) as f:
        spec = TaskSpec.from_json(f.read())
    apply_with(flow_cls, spec.with_decorators)
    bind_task_configs(flow_cls, spec)  # config values in decorators, as the run bound them
    return run_task(flow_cls, spec)
