"""`current.torch.run(...)` for @torchrun steps: launch torchrun with the gang's nnodes, node_rank and master.

Any torchrun entrypoint runs: a module (`stoker.train`) or a script path with its own flags (the Neuron
samples' NxD pretraining script, as a Metaflow flow runs it). A gang whose nodes are all on this machine (a local gang:
its rendezvous is a loopback address) and a gang with spares fork their ranks from a warm launcher instead
(distributed/warm.py: torchrun's environment, `[default<rank>]:` prefixes, fail-fast), started when the task starts;
`STOKER_WARM_RANKS=0` runs torchrun for a local gang. On the node it also
- derives `nproc_per_node` from the step's request and what the node has, and prints it with its source;
- sets the EFA / Neuron variables the step needs (`accel.node_env`; the user's values win);
- on Neuron, fetches the compile cache from the store before and uploads it after, even after a failure
  (`neuron_cache`), and runs `neuron_parallel_compile` first when `precompile=` asks for it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stoker import exitstatus
from stoker._process import die_with_parent, kill_grace, raise_open_files_limit, signal_tree
from stoker.distributed import neuron_cache
from stoker.distributed import smoke as smoke_mode
from stoker.distributed.accel import (
    Accelerators,
    detect,
    node_env,
    nproc_for,
    nproc_problem,
    on_this_host,
    step_request,
    wants_neuron,
)
from stoker.distributed.generations import GangLink, GenerationCut, run_generations
from stoker.distributed.torchrun_report import TorchrunStderr, preempted
from stoker.errors import ConfigError, StokerError
from stoker.flow.current import ParallelInfo, current
from stoker.redact import redact_command
from stoker.store.goodput import timed as timed_phase


def derive_nproc_per_node(resources: Mapping[str, Any] | None, options: Mapping[str, Any] | None = None, *,
                          accelerators: Accelerators | Callable[[], Accelerators] | None = None,
                          env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """Processes per node and where the number comes from (never a silent 1).

    From the step's request (`@resources` and `@batch`, the larger of each): GPUs; else Trainium/Inferentia
    devices x NeuronCores per device (of `instance_type=`, else as detected here, else 2, said so); else CPUs.
    A step that asks for none of these gets what the node has (NeuronCores, else GPUs), else 1.
    `accelerators` replaces the detection (tests, or a caller that already looked)."""
    if isinstance(accelerators, Accelerators):
        acc = accelerators
        detected: Callable[[], Accelerators] = lambda: acc  # noqa: E731
    elif accelerators is not None:
        detected = accelerators
    else:
        itype = step_request(resources, options).get("instance_type")
        detected = lambda: detect(env, instance_type=itype)  # noqa: E731
    return nproc_for(resources, options, detected, env)


def _args_list(args: Mapping[str, Any] | Sequence[str] | None) -> list[str]:
    if args is None:
        return []
    if isinstance(args, Mapping):
        out: list[str] = []
        for k, v in args.items():
            flag = k if k.startswith("-") else f"--{k}"
            if v is True:
                out.append(flag)
            elif v is False or v is None:
                continue
            else:
                out += [flag, str(v)]
        return out
    if isinstance(args, str):
        raise ConfigError(f"args={args!r}: give a dict of flags ({{'max_steps': 10}}) or a list of strings "
                          f"(['--max_steps', '10']), not one string")
    return [str(a) for a in args]


def _flag_values(args: Mapping[str, Any] | Sequence[str] | None) -> dict[str, str]:
    """`--flag` -> its (first) value in `args` (`--flag=value` too)."""
    out: dict[str, str] = {}
    toks = _args_list(args)
    for i, tok in enumerate(toks):
        if _is_flag(tok):
            name, eq, value = tok.partition("=")
            if eq:
                out.setdefault(name, value)
            elif i + 1 < len(toks) and not _is_flag(toks[i + 1]):
                out.setdefault(name, toks[i + 1])
    return out


def _is_flag(tok: str) -> bool:
    return tok.startswith("-") and not re.fullmatch(r"-\d+(\.\d*)?([eE][-+]?\d+)?", tok)


def override_args(args: Mapping[str, Any] | Sequence[str] | None, overrides: Mapping[str, Any]) -> list[str]:
    """`args` with each flag of `overrides` replaced (`{"max_steps": 10}`; False/None drops a flag)."""
    out = _args_list(args)
    for k, v in overrides.items():
        flag = k if k.startswith("-") else f"--{k}"
        kept: list[str] = []
        i = 0
        while i < len(out):
            tok = out[i]
            if tok == flag:
                i += 1
                while i < len(out) and not _is_flag(out[i]):  # its value(s), negative numbers included
                    i += 1
                continue
            if not tok.startswith(flag + "="):
                kept.append(tok)
            i += 1
        out = kept + _args_list({flag: v})
    return out


@dataclass
class TorchrunHelper:
    """Launches torchrun on this gang node; rank 0 lives on node 0 (the gang's main node)."""

    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    nproc_per_node: int | None = None  # None: derived on first use (derive_nproc_per_node)
    nproc_source: str = ""
    max_restarts: int = 0
    tee: bool = True
    rdzv_timeout: int = 600  # seconds the nodes wait for each other (torchrun's static rendezvous)
    resources: dict[str, Any] = field(default_factory=dict)  # the step's @resources
    options: dict[str, Any] = field(default_factory=dict)  # the step's @batch
    store_url: str | None = None  # where the Neuron compile cache is kept
    neuron_cache: str | None = neuron_cache.DEFAULT_PREFIX  # its prefix there; None: not kept
    precompile: bool | Mapping[str, Any] = False
    neuron: bool | None = None  # None: the step asks for Neuron devices, or the node has some
    accelerators: Callable[[], Accelerators] | None = None  # replaces the node's detection (tests)
    log_dir: str | None = None  # torchrun's own log folder: under the task's tempdir, removed with it
    stage_flags: list[str] | dict[str, str] | None = None  # @torchrun(stage=...): inputs to copy to the node
    staged: list[Any] = field(default_factory=list)  # what was staged on this node (distributed.stage.Staged)
    gang: Any = None  # a gang with spares: its GangLink (distributed/generations.py), else None
    worker_codes: set[int] = field(default_factory=set)  # the exit codes of this node's workers' last failure

    @classmethod
    def from_settings(cls, attrs: Mapping[str, Any], par: ParallelInfo, resources: Mapping[str, Any],
                      options: Mapping[str, Any]) -> TorchrunHelper:
        """The launcher of one gang node: `attrs` the step's @torchrun arguments, `resources` what a node asks for
        (@resources), `options` the step's backend decorator's (e.g. @batch(trainium=16))."""
        n, src = (int(attrs["nproc_per_node"]), "@torchrun(nproc_per_node=...)") if attrs.get("nproc_per_node") \
            else (None, "")
        port = attrs.get("master_port") or par.port or 29500
        return cls(nnodes=par.num_nodes, node_rank=par.node_index, master_addr=par.main_ip,
                   master_port=int(port), nproc_per_node=n, nproc_source=src,
                   max_restarts=int(attrs.get("max_restarts") or 0), tee=bool(attrs.get("tee", True)),
                   rdzv_timeout=int(attrs.get("rdzv_timeout") or os.environ.get("STOKER_RDZV_TIMEOUT")
                                    or attrs.get("all_nodes_started_timeout") or 600),
                   resources={k: v for k, v in resources.items() if v is not None},
                   options={k: v for k, v in options.items() if v is not None},
                   store_url=current.get("store_url"),
                   neuron_cache=attrs.get("neuron_cache", neuron_cache.DEFAULT_PREFIX) or None,
                   precompile=attrs.get("precompile") or False, stage_flags=attrs.get("stage") or None,
                   log_dir=os.path.join(current.get("tempdir"), "torchrun") if current.get("tempdir") else None,
                   gang=_gang_link(par, port, bool(attrs.get("evict_stragglers"))))

    @property
    def request(self) -> dict[str, Any]:
        return step_request(self.resources, self.options)

    def resolved_nproc(self) -> tuple[int, str]:
        """(processes per node, why), derived once."""
        if self.nproc_per_node is None:
            self.nproc_per_node, self.nproc_source = derive_nproc_per_node(
                self.resources, self.options, accelerators=self.accelerators)
        return self.nproc_per_node, self.nproc_source

    def uses_neuron(self) -> bool:
        if self.neuron is None:
            self.neuron = wants_neuron(self.request)
        return self.neuron

    def command(self, entrypoint: str, args: Any = None, module: bool | None = None,
                nproc_per_node: int | None = None) -> list[str]:
        is_module = module if module is not None else not entrypoint.endswith(".py")
        cmd = [sys.executable, "-m", "torch.distributed.run",
               f"--nnodes={self.nnodes}", f"--node_rank={self.node_rank}",
               f"--nproc_per_node={nproc_per_node or self.resolved_nproc()[0]}",
               f"--master_addr={self.master_addr}", f"--master_port={self.master_port}",
               f"--max_restarts={self.max_restarts}"]
        if self.nnodes > 1:  # nodes of a cluster job may start minutes apart (image pulls)
            cmd += [f"--rdzv_conf=timeout={self.rdzv_timeout}"]
        if self.log_dir:  # else torchrun leaves a torchelastic_* folder in /tmp behind every attempt
            cmd += [f"--log-dir={self.log_dir}"]
        if self.tee:
            cmd += ["--tee=3"]  # every rank's output, prefixed with its rank, on this node's log
        cmd += (["-m", entrypoint] if is_module else [entrypoint]) + _args_list(args)
        return cmd

    def _smoke_args(self, entrypoint: str, args: Any, given: Mapping[str, Any] | None) -> list[str]:
        over = smoke_mode.command_overrides(entrypoint, args, given)
        out = override_args(args, over) if over else _args_list(args) + smoke_mode.stoker_train_args()
        shown = " ".join(_args_list(over)) if over else " ".join(smoke_mode.stoker_train_args())
        print(f"torchrun: smoke run: {shown}", flush=True)
        return out

    def stage(self, url: str) -> str:
        """Copy a store URL (`s3://...`) to this node's disk, verified and cached across attempts; its local path.
        What it cost is printed and kept in `self.staged` (see `stoker.distributed.stage`)."""
        from stoker.distributed.stage import stage

        with timed_phase("stage"):  # the ledger's start-up phases (stoker.store.goodput)
            staged = stage(url)
        self.staged.append(staged)
        print(staged.summary(), flush=True)
        return staged.path

    def _stage_args(self, args: Any, stage: Sequence[str] | Mapping[str, str] | str | None) -> Any:
        """`args` with the store URLs named by `stage` replaced by their staged local copies: a list of flag
        names whose values are URLs (`["data_dir"]`), or a dict of flag -> URL (`{"data_dir": "s3://..."}`)."""
        if not stage:
            return args
        if isinstance(stage, str):
            stage = [stage]
        wanted = dict(stage) if isinstance(stage, Mapping) else {}
        if not isinstance(stage, Mapping):
            given = _flag_values(args)
            for name in stage:
                flag = name if name.startswith("-") else f"--{name}"
                if flag not in given:
                    raise ConfigError(f"stage={list(stage)!r}: the command has no {flag} to stage; name a flag "
                                      f"of args, or give stage={{'{name.lstrip('-')}': 's3://...'}}")
                wanted[name] = given[flag]
        return override_args(args, {k: self.stage(str(v)) for k, v in wanted.items()})

    def run(self, entrypoint: str, args: Any = None, entrypoint_args: Any = None, module: bool | None = None,
            nproc_per_node: int | None = None, env: Mapping[str, str] | None = None,
            precompile: bool | Mapping[str, Any] | None = None,
            stage: Sequence[str] | Mapping[str, str] | str | None = None, preflight: bool | None = None,
            preflight_paths: Sequence[str] = (), smoke: Mapping[str, Any] | None = None, **_: Any) -> None:
        """Run `entrypoint` (a module like `stoker.train`, or a script path) under torchrun; raise on failure.

        `precompile=True` first runs the same command under `neuron_parallel_compile`; a dict
        (`{"steps_this_run": 2}`) overrides those flags for that pass only. Default: @torchrun(precompile=...).
        `stage=["data_dir"]` copies the store URL given as `--data_dir` to this node's disk first (verified,
        cached across attempts) and passes the local path instead; default: @torchrun(stage=...).
        Before the command, a gang checks its nodes (`distributed.preflight`: devices, EFA, imports, staged data and
        `preflight_paths`, disk, an all_reduce); `preflight=False` skips it, `True` runs it on one node too.
        `smoke={"max_steps": 20}`: the flags a `run --smoke` changes (stoker.train and NxD's Llama scripts are
        known; see `stoker.distributed.smoke`)."""
        args = args if args is not None else entrypoint_args
        if smoke_mode.enabled():
            args = self._smoke_args(entrypoint, args, smoke)
        args = self._stage_args(args, stage if stage is not None else self.stage_flags)
        raise_open_files_limit()
        pre = self.precompile if precompile is None else precompile
        if pre is not False and not isinstance(pre, (bool, Mapping)):
            raise ConfigError(f"precompile={pre!r}: use True, or a dict of the flags to change for the "
                              f"pre-compilation pass, e.g. precompile={{'steps_this_run': 2}}")
        n, source = (nproc_per_node, "given to current.torch.run") if nproc_per_node else self.resolved_nproc()
        if problem := nproc_problem(n, self.request):
            raise ConfigError(f"torchrun: {problem} ({source})")
        neuron = self.uses_neuron()
        added, child_env = self._child_env(env)
        print(f"torchrun: node {self.node_rank}/{self.nnodes}, {n} processes per node ({source}), "
              f"master {self.master_addr}:{self.master_port}", flush=True)
        if added:
            print(f"torchrun: node environment {' '.join(f'{k}={v}' for k, v in sorted(added.items()))}",
                  flush=True)
        sync = self._cache_sync(child_env) if neuron else None
        if sync:
            sync("fetch")
        from stoker.distributed.preflight import gate, local_doc

        warm = self.warm_ranks()
        if warm:  # its ranks are forked from a warm launcher: its imports start now (torch's at the task's start)
            self._warm(entrypoint, module, child_env)
        if self.gang is not None and self.node_rank == 0:  # what the spares get ready (and check) while they wait
            self.gang.publish_warmup(self.staged, self.neuron_cache if sync else None, self.store_url,
                                     local_doc(self, entrypoint, module, child_env, asked=preflight,
                                               paths=preflight_paths), entry=_entry(entrypoint, module))

        if self.gang is not None and self.gang.joining():
            print("torchrun: preflight skipped: this spare joins a running gang (it ran the local checks while it "
                  "waited; the all_reduce would wait for the others)", flush=True)
        else:
            with timed_phase("preflight"):
                gate(self, entrypoint, module, n, child_env, asked=preflight, paths=preflight_paths)
        try:
            self._train(entrypoint, args, module, n, child_env, pre, sync, warm)
        finally:
            if sync:
                sync("upload")

    def _train(self, entrypoint: str, args: Any, module: bool | None, n: int, child_env: dict[str, str],
               pre: bool | Mapping[str, Any], sync: Callable[..., None] | None, warm: bool) -> None:
        """The pre-compilation pass when asked, then the ranks: per generation (a gang with spares), forked from the
        warm launcher (every node on this machine), or under torchrun."""
        if pre:
            with timed_phase("precompile"):
                self._precompile(entrypoint, args, module, n, child_env, pre)
            if sync:
                sync("upload", "precompile")  # the graphs it compiled: part of the pre-compilation
        if not warm:
            self._spawn(self.command(entrypoint, args, module, n), child_env, "torchrun")
            return
        from stoker.distributed.warm import close_all

        try:
            if self.gang is not None:  # a gang with spares: its ranks per generation (distributed/generations.py)
                run_generations(self, self.gang, lambda genv, cut: self._spawn_warm(entrypoint, args, module, n,
                                                                                    genv, cut), child_env)
            else:
                self._spawn_warm(entrypoint, args, module, n, child_env)
        finally:
            close_all()

    def _child_env(self, env: Mapping[str, str] | None) -> tuple[dict[str, str], dict[str, str]]:
        """(what the node adds for its devices and network, the ranks' whole environment)."""
        base = {**os.environ, **(env or {})}
        added = node_env(self.request, base, neuron_devices=1 if self.uses_neuron() else 0)
        child_env = {**base, **added}
        child_env.setdefault("OMP_NUM_THREADS", "1")
        return added, child_env

    def warm_ranks(self) -> bool:
        """Whether this node forks its ranks from a warm launcher (distributed/warm.py) instead of running torchrun:
        a gang with spares always; any other when every node is on this machine (the rendezvous is a loopback
        address: a local gang), unless $STOKER_WARM_RANKS=0, max_restarts asks torchrun to restart the workers in
        place, or the ranks run on Neuron (its runtime cannot be forked: each rank would start anew anyway)."""
        if self.gang is not None:
            return True
        from stoker.distributed.warm import OFF_ENV

        return (os.environ.get(OFF_ENV, "1") != "0" and not self.max_restarts and on_this_host(self.master_addr)
                and not self.uses_neuron())

    def start_early(self) -> None:
        """Start the warm launcher when the task starts (`@torchrun`'s task_started), so that its Python and torch
        imports overlap the step's own code before `run()`; a gang with spares starts its own in `run()` (a spare's
        waits warm already). Best effort: `run()` starts one if this could not."""
        if self.gang is not None or not self.warm_ranks():
            return
        try:
            from stoker.distributed.warm import WarmLauncher

            WarmLauncher.get(self._child_env(None)[1], os.getcwd()).preload()
        except Exception as e:  # noqa: BLE001 - run() starts it then
            print(f"stoker: could not start the warm launcher early ({e})", file=sys.stderr, flush=True)

    def _warm(self, entrypoint: str, module: bool | None, env: Mapping[str, str]) -> None:
        """Start this node's warm launcher (a spare's is already running) and its imports of the entrypoint's."""
        from stoker.distributed.warm import WarmLauncher

        WarmLauncher.get(env, os.getcwd()).preload(*_entry(entrypoint, module))

    def _precompile(self, entrypoint: str, args: Any, module: bool | None, n: int, env: dict[str, str],
                    pre: bool | Mapping[str, Any]) -> None:
        exe = shutil.which("neuron_parallel_compile", path=env.get("PATH"))
        if not exe:
            raise ConfigError("precompile= needs neuron_parallel_compile on PATH: it ships with torch-neuronx "
                              "(the Neuron training DLC has it); run the step in a Neuron image, or drop "
                              "precompile")
        overrides = dict(pre) if isinstance(pre, Mapping) else {}
        shown = f" with {' '.join(_args_list(overrides))}" if overrides else ""
        print(f"torchrun: pre-compilation pass (neuron_parallel_compile{shown})", flush=True)
        # a few compile-only steps: not the run's training curve
        quiet = {k: v for k, v in env.items() if k not in ("STOKER_METRICS_STORE", "STOKER_TENSORBOARD_PREFIX")}
        self._spawn([exe, *self.command(entrypoint, override_args(args, overrides), module, n)], quiet,
                    "neuron_parallel_compile")

    def _cache_sync(self, env: Mapping[str, str]) -> Callable[[str], None] | None:
        """fetch/upload of the Neuron compile cache, best effort: a failure costs a recompilation, never the run."""
        if not self.neuron_cache:
            return None
        local = neuron_cache.local_cache_dir(env)
        if local is None:
            print("neuron cache: the Neuron cache URL is remote (s3://...), Neuron keeps it itself; stoker does "
                  "not copy it", flush=True)
            return None
        if not self.store_url:
            print("neuron cache: this task knows no store, so compiled graphs are not kept", flush=True)
            return None
        from stoker.store.blobs import open_store

        store_url, prefix = self.store_url, self.neuron_cache

        def sync(action: str, phase: str = "") -> None:
            try:
                fn = neuron_cache.fetch if action == "fetch" else neuron_cache.upload
                with timed_phase(phase or f"neuron_cache_{action}"):
                    report = fn(open_store(store_url), prefix, local)
                print(f"neuron cache: {report.summary()} ({store_url}/{neuron_cache.normalize_prefix(prefix)} "
                      f"<-> {local})", flush=True)
            except Exception as e:  # noqa: BLE001 - the run goes on; the graphs compile again next time
                print(f"neuron cache: {action} failed ({e}); training goes on, the next run may compile again",
                      file=sys.stderr, flush=True)

        return sync

    def _spawn(self, cmd: list[str], env: Mapping[str, str], what: str,
               cut_when: Callable[[], bool] | None = None) -> None:
        """Run torchrun and wait for it (see `_supervise`). torchrun exits 1 whatever its workers' codes were: they
        come back through $STOKER_EXIT_STATUS_DIR, and its own report of them through its stderr (TorchrunStderr)."""
        status_dir, env = self._status_env(env)
        print(f"stoker: node {self.node_rank} runs: {redact_command(cmd)}", flush=True)  # the error only names it
        grace = kill_grace(env)
        env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(max(1, int(grace))))  # torchrun's own wait
        proc = subprocess.Popen(cmd, env=dict(env), preexec_fn=die_with_parent, stderr=subprocess.PIPE)
        report = TorchrunStderr(proc.stderr)  # type: ignore[arg-type]  # its end-of-workers report: see finish()
        self._supervise(_Torchrun(proc), report, status_dir, grace, what, _short(cmd), cut_when)

    def _spawn_warm(self, entrypoint: str, args: Any, module: bool | None, n: int, env: Mapping[str, str],
                    cut_when: Callable[[], bool] | None = None) -> None:
        """Fork this node's `n` ranks from its warm launcher (distributed/warm.py: a gang with spares) and wait for
        them as for torchrun (`_supervise`)."""
        from stoker.distributed.warm import WarmLauncher, rank_env

        mod, script = _entry(entrypoint, module)
        status_dir, env = self._status_env(env)
        argv = _args_list(args)
        shown = redact_command([*(["-m", mod] if mod else [str(script)]), *argv])
        warm, grace = WarmLauncher.get(env, os.getcwd()), kill_grace(env)
        t0 = time.monotonic()
        ranks = warm.launch(module=mod, script=script, args=argv, env=env, cwd=os.getcwd(), tee=self.tee, grace=grace,
                            ranks=[rank_env(self.node_rank, self.nnodes, n, i, self.master_addr, self.master_port)
                                   for i in range(n)])
        why = f" (the warm launcher has {unsafe}: not safe to fork)" if (unsafe := warm.preloaded.get("unsafe")) else ""
        how = f"started as new processes{why}" if ranks.fresh else \
            f"forked from the warm launcher ({warm.preloaded['s']:.1f} s of imports done before)"
        print(f"stoker: node {self.node_rank} runs {n} rank(s) {how} in {time.monotonic() - t0:.2f} s: {shown}",
              flush=True)
        self._supervise(ranks, ranks, status_dir, grace, "torchrun", f"ranks ... {_short(shown.split())}", cut_when)

    def _status_env(self, env: Mapping[str, str]) -> tuple[str, dict[str, str]]:
        status_dir = tempfile.mkdtemp(prefix="exit-", dir=current.get("tempdir") or None)
        return status_dir, {**env, exitstatus.ENV: status_dir}

    def _supervise(self, proc: Any, report: Any, status_dir: str, grace: float, what: str, short: str,
                   cut_when: Callable[[], bool] | None) -> None:
        """Wait for torchrun or the warm ranks (`proc`). A SIGTERM to this task (a preemption, a cancel) reaches the
        workers (stoker.train finishes its step, checkpoints and exits with 75) and they are given
        $STOKER_KILL_GRACE seconds to end before they are killed. The workers' exit codes come back through
        `status_dir`: Preempted or a permanent ConfigError is raised for the scheduler to act on. `cut_when`, asked
        every tenth of a second, ends the workers at once when it says so (a gang with spares moved to its next
        generation): GenerationCut is raised."""
        term = _ForwardSigterm(proc)
        try:
            rc = term.wait(grace + 5, cut_when)
        except BaseException:
            proc.terminate()
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
            report.finish(False, self.node_rank)
            raise
        finally:
            term.restore()
        if term.cut:  # its collectives lost a peer: what its workers said is not this node's failure
            report.finish(True, self.node_rank)
            shutil.rmtree(status_dir, ignore_errors=True)
            raise GenerationCut(f"{what} on node {self.node_rank} ended for the gang's next generation")
        report.finish(rc != 0 and preempted(status_dir), self.node_rank, succeeded=rc == 0)  # no tracebacks then
        self.worker_codes = report.codes
        try:
            if rc != 0:
                exitstatus.raise_for_statuses(status_dir, StokerError(
                    f"{what} exited with code {rc} on node {self.node_rank} ({short}; the whole command is at "
                    f"the top of the node's log)"))
        finally:
            shutil.rmtree(status_dir, ignore_errors=True)
        if term.hit:  # asked to stop, and the workers finished anyway: stop as asked
            os.kill(os.getpid(), signal.SIGTERM)


class _Torchrun:
    """torchrun's process, as `_supervise` stops it: its workers first (SIGTERM), everything at once (SIGKILL)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc

    def wait(self, timeout: float | None = None) -> int:
        return self.proc.wait(timeout=timeout)

    def terminate(self) -> None:
        self.proc.terminate()

    def kill(self) -> None:
        signal_tree(self.proc.pid, signal.SIGKILL, tree=True)
        self.proc.kill()

    def term_workers(self) -> None:
        import psutil

        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            kids = []
        for k in kids:
            try:
                k.send_signal(signal.SIGTERM)
            except psutil.Error:
                pass


def _entry(entrypoint: str, module: bool | None) -> tuple[str | None, str | None]:
    """(module, script) of an entrypoint: `-m stoker.train`, or a script's path."""
    is_module = module if module is not None else not entrypoint.endswith(".py")
    return (entrypoint, None) if is_module else (None, entrypoint)


def _gang_link(par: ParallelInfo, port: Any, evict: bool) -> Any:
    """The link to its gang's generations of a node of a gang with spares (distributed/generations.py), else None."""
    if not getattr(par, "spares", 0):
        return None
    return GangLink.for_task(par, int(port), evict)


def _short(cmd: list[str]) -> str:
    """`torchrun ... ENTRYPOINT` of a command: what an error line names (the full command is ~1,500 characters)."""
    launcher = "torch.distributed.run"
    rest = cmd[cmd.index(launcher) + 1:] if launcher in cmd else cmd[1:]
    name = "torchrun" if launcher in cmd else os.path.basename(cmd[0])
    for i, a in enumerate(rest):  # the launcher's own options are --flag=value
        if a == "-m" and i + 1 < len(rest):
            return f"{name} ... -m {rest[i + 1]}"
        if not a.startswith("-"):
            return f"{name} ... {a}"
    return name


class _ForwardSigterm:
    """While the workers run: SIGTERM to this task goes to the workers (their handler finishes the step and
    checkpoints) instead of ending this process; torchrun itself is left to notice them exit (a second SIGTERM
    would cut its own shutdown short). After `grace` seconds they are killed. `proc`: a _Torchrun, or warm Ranks."""

    def __init__(self, proc: Any) -> None:
        self.proc, self.hit, self.deadline, self.cut = proc, False, None, False
        self.installed = threading.current_thread() is threading.main_thread()
        self.old = signal.signal(signal.SIGTERM, self._on_term) if self.installed else None

    def _on_term(self, signum: int, frame: Any) -> None:
        self.hit = True
        if self.deadline is None:
            self.deadline = time.monotonic() + self.grace
            print("torchrun: SIGTERM: asking the workers to checkpoint and stop", file=sys.stderr, flush=True)
            self.proc.term_workers()

    def wait(self, grace: float, cut_when: Callable[[], bool] | None = None) -> int:
        self.grace = grace
        while True:
            try:
                return self.proc.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                over = self.deadline is not None and time.monotonic() > self.deadline
                if not over and not self.cut and cut_when is not None and cut_when():
                    self.cut = over = True
                if over:
                    self.proc.kill()

    def restore(self) -> None:
        if self.installed:
            signal.signal(signal.SIGTERM, self.old if self.old is not None else signal.SIG_DFL)
