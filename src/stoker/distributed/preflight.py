"""The gang's preflight: check every allocated node before a @torchrun step's training command starts.

On each node, in this order (the cheap local checks first, then one collective across the whole gang):
1. accelerators: the step asks for trainium/inferentia -> at least that many `/dev/neuron*` devices and a
   working `neuron-ls`; it asks for gpu -> `nvidia-smi -L` lists at least that many GPUs;
2. efa > 0: `fi_info -p efa` succeeds (and lists at least `efa` interfaces when its output says how many);
3. the entrypoint's imports resolve in the node's Python (a module: `find_spec`, then the top-level imports
   of the file `-m` runs; a script: it exists and its top-level imports resolve, its folder first);
4. the staged data the caller names exists and is not empty;
5. disk: on Neuron the compile cache's folder has at least `STOKER_PREFLIGHT_MIN_DISK_GB` free (default
   `DEFAULT_MIN_DISK_GB`);
6. an all_reduce across all nodes x nproc_per_node ranks (`stoker.train.collectives` under torchrun, on the real
   backend: NCCL, XLA on Neuron, gloo on CPU) reaches the bus-bandwidth floor of the instance type
   (`MIN_BUSBW_GBPS`, overridden by `STOKER_PREFLIGHT_MIN_BUSBW_GBPS`). Not when every node is this machine (a
   local gang: the rendezvous is a loopback address): it would test loopback, not a network, for the price of a
   torchrun and nproc Pythons importing torch per node; a floor in `STOKER_PREFLIGHT_MIN_BUSBW_GBPS` or
   `STOKER_PREFLIGHT_ALLREDUCE=1` runs it there too. Checks 1-5 stay: each can fail on one host too (a missing
   module, staged data, a GPU, a full disk), and together they start one short Python (the imports check).

A failure raises :class:`PreflightError`, a permanent error: the scheduler never retries it (the same nodes
would fail the same way), and the message names the node (index and host name), the check and what to do.
Every node prints one line (`preflight: node 1 (host) ok in 4.2 s: ...; 1 Python started` or `... failed in 2.0
s: ...`, with how many Python interpreters its checks started); its time is the preflight's share of the run's
paid time (`PREFLIGHT_LINE` parses it).

Off with `run --no-preflight` (the run sets `STOKER_PREFLIGHT=0` for its tasks) or
`current.torch.run(..., preflight=False)`; `STOKER_PREFLIGHT=1` or `preflight=True` runs it on one node too.
Commands, the disk probe, the all_reduce launcher and the clock are injected (tests give their own).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stoker._process import die_with_parent
from stoker.distributed.accel import DEV_DIR, neuron_device_count, on_this_host
from stoker.distributed.neuron_cache import local_cache_dir
from stoker.errors import ConfigError

ENV = "STOKER_PREFLIGHT"  # 0: off (run --no-preflight); 1: also on a single node
MIN_BUSBW_ENV = "STOKER_PREFLIGHT_MIN_BUSBW_GBPS"
MIN_DISK_ENV = "STOKER_PREFLIGHT_MIN_DISK_GB"
ALLREDUCE_ENV = "STOKER_PREFLIGHT_ALLREDUCE"  # 1: the all_reduce also when every node is this machine
TIMEOUT_ENV = "STOKER_PREFLIGHT_TIMEOUT"  # seconds the all_reduce may take before its watchdog fails it
DEFAULT_MIN_DISK_GB = 20.0  # a Llama-size compile cache holds a few GB of NEFFs; room for a few configs
PORT_OFFSET = 1  # the all_reduce rendezvous on master_port + 1: a slow node's preflight store never meets
# the training command's rendezvous on master_port

# Bus-bandwidth floors (GB/s, NCCL-tests convention) for the preflight's all_reduce of `MESSAGE_BYTES` across
# a gang of such nodes. Deliberately low: they sit well under what a healthy EFA fabric gives and above what a
# gang that fell back to TCP sockets gets (a few GB/s), so they catch a missing or misconfigured EFA, not a
# slow day. Per-cluster values belong in STOKER_PREFLIGHT_MIN_BUSBW_GBPS. Unknown types and CPU: no floor.
MIN_BUSBW_GBPS: dict[str, float] = {
    "trn1.32xlarge": 10.0,  # 800 Gbps EFA, 16 Trainium devices
    "trn1n.32xlarge": 20.0,  # 1600 Gbps EFA
    "trn2.48xlarge": 40.0,  # 3200 Gbps EFA
    "p4d.24xlarge": 10.0,  # 8 A100, 400 Gbps EFA
    "p4de.24xlarge": 10.0,
    "p5.48xlarge": 40.0,  # 8 H100, 3200 Gbps EFA
    "p5e.48xlarge": 40.0,
    "p5en.48xlarge": 40.0,
}
CPU_MIN_BUSBW_GBPS = 0.0
MESSAGE_BYTES = {"cpu": "4M", "gpu": "256M", "neuron": "64M"}  # one size: one compiled graph on XLA
PREFLIGHT_LINE = re.compile(r"^preflight: node (\d+) \((.*?)\) (ok|failed) in ([0-9.]+) s")

CommandRunner = Callable[[Sequence[str], Mapping[str, str]], "tuple[int, str]"]  # argv, env -> (rc, output)
Launcher = Callable[[Sequence[str], Mapping[str, str], float], int]  # torchrun argv, env, timeout -> rc


class PreflightError(ConfigError):
    """A node of the gang failed its preflight: permanent, so the run stops instead of retrying on it."""

    def __init__(self, node: int, host: str, check: str, problem: str, fix: str) -> None:
        self.node, self.host, self.check = node, host, check
        super().__init__(f"preflight failed on node {node} ({host}), check {check}: {problem}; {fix} "
                         f"(or skip the preflight: run --no-preflight)")


class CheckFailed(Exception):
    """One check's verdict: what is wrong and what to do (turned into PreflightError with the node)."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.problem, self.fix = problem, fix


def run_command(argv: Sequence[str], env: Mapping[str, str], timeout: float = 60.0) -> tuple[int, str]:
    """The default CommandRunner: exit status and output (stdout then stderr); 127 when it cannot start."""
    try:
        p = subprocess.run(list(argv), env=dict(env), capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        return 127, str(e)
    except (OSError, subprocess.SubprocessError) as e:
        return 126, str(e)
    return p.returncode, p.stdout + p.stderr


def launch(argv: Sequence[str], env: Mapping[str, str], timeout: float) -> int:
    """The default Launcher: run torchrun (its output goes to the task's log) and wait at most `timeout`."""
    proc = subprocess.Popen(list(argv), env=dict(env), preexec_fn=die_with_parent)
    try:
        return proc.wait(timeout=timeout)
    except BaseException:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise


def free_bytes(path: str) -> int:
    """Free space of the filesystem holding `path` (its nearest existing folder)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def enabled(nnodes: int, asked: bool | None, env: Mapping[str, str]) -> bool:
    """Whether to run it: STOKER_PREFLIGHT=0 (run --no-preflight) wins; then the caller's preflight=; then
    STOKER_PREFLIGHT=1; by default on for gangs (more than one node)."""
    value = env.get(ENV, "").strip().lower()
    if value in ("0", "false", "no", "off"):
        return False
    if asked is not None:
        return asked
    if value in ("1", "true", "yes", "on"):
        return True
    return nnodes > 1


def min_busbw(instance_type: str | None, kind: str, env: Mapping[str, str]) -> tuple[float, str]:
    """The all_reduce floor (GB/s) and where it comes from."""
    if env.get(MIN_BUSBW_ENV):
        try:
            return float(env[MIN_BUSBW_ENV]), MIN_BUSBW_ENV
        except ValueError:
            raise ConfigError(f"{MIN_BUSBW_ENV}={env[MIN_BUSBW_ENV]!r}: give a number of GB/s, e.g. 10") from None
    if instance_type and instance_type in MIN_BUSBW_GBPS:
        return MIN_BUSBW_GBPS[instance_type], instance_type
    if kind == "cpu":
        return CPU_MIN_BUSBW_GBPS, "CPU default"
    return 0.0, f"no floor known for {instance_type or 'this instance type'}"


# `python -c` in the node's Python, with the training command's environment: which modules are missing.
_IMPORTS_CODE = r"""
import ast, importlib.util, json, os, sys
kind, target = sys.argv[1], sys.argv[2]
def tops(path):
    try:
        tree = ast.parse(open(path, "rb").read(), path)
    except (OSError, SyntaxError, ValueError) as e:
        return None, str(e)
    names = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.append(node.module.split(".")[0])
    return list(dict.fromkeys(names)), None
def find(name):
    try:
        return importlib.util.find_spec(name)
    except Exception:
        return None
out = {"missing": [], "error": None}
if kind == "module":
    spec = find(target)
    if spec is None:
        parts = target.split(".")
        first = next((".".join(parts[:i]) for i in range(1, len(parts) + 1) if find(".".join(parts[:i])) is None),
                     target)
        out["missing"].append(first)
    else:
        path = spec.origin
        if spec.submodule_search_locations:
            main = find(target + ".__main__")
            path = main.origin if main is not None else None
        names, _ = tops(path) if path and path.endswith(".py") else ([], None)
        out["missing"] += [n for n in names or [] if find(n) is None]
else:
    if not os.path.isfile(target):
        out["error"] = "not found"
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
        names, err = tops(target)
        out["error"] = err
        out["missing"] += [n for n in names or [] if find(n) is None]
print(json.dumps(out))
"""


@dataclass(kw_only=True)
class Preflight:
    """The checks of one node. `allreduce_command(extra_args)` is the torchrun command line (all nodes x
    nproc_per_node) that runs `stoker.train.collectives` with `extra_args`; None skips the all_reduce."""

    node: int
    nnodes: int
    request: Mapping[str, Any] = field(default_factory=dict)  # accel.step_request of the step
    entrypoint: str = ""
    module: bool | None = None  # None: a path ending in .py is a script
    neuron: bool = False  # the training runs on Neuron (asked for, or the node has devices)
    instance_type: str | None = None
    data_paths: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    python: str = sys.executable
    allreduce_command: Callable[[list[str]], list[str]] | None = None
    one_host: bool = False  # every node of the gang is this machine: the all_reduce is skipped (see all_reduce)
    tempdir: str | None = None
    host: str = field(default_factory=socket.gethostname)
    dev_dir: str = DEV_DIR
    run: CommandRunner = run_command
    launch: Launcher = launch
    free_bytes: Callable[[str], int] = free_bytes
    clock: Callable[[], float] = time.monotonic
    out: Callable[[str], None] = field(default=lambda line: print(line, flush=True))
    pythons: int = 0  # the Python interpreters the checks started (the line says how many: its cost)

    # -- the checks: each returns its part of the summary line, or raises CheckFailed ---------------
    def accelerators(self) -> str:
        req = self.request
        neuron = max(float(req.get("trainium") or 0), float(req.get("inferentia") or 0))
        if neuron > 0:
            want = int(neuron)
            have = neuron_device_count(self.dev_dir)
            if have < want:
                raise CheckFailed(f"the step asks for {want} Neuron devices but {self.dev_dir} has {have} "
                                  f"(/dev/neuron*)", "run on an instance type with that many devices, pass them "
                                  "into the container (Batch: a Neuron-enabled compute environment), or lower "
                                  "trainium=/inferentia=")
            exe = self._which("neuron-ls")
            if not exe:
                raise CheckFailed("neuron-ls is not on PATH", "use the Neuron DLC image or install aws-neuronx-tools")
            rc, text = self.run([exe], self.env)
            if rc != 0:
                raise CheckFailed(f"`neuron-ls` exited {rc}: {_tail(text)}",
                                  "check the Neuron driver (aws-neuronx-dkms) and runtime on this node")
            return f"{have} neuron devices"
        if float(req.get("gpu") or 0) > 0:
            want = int(float(req["gpu"]))
            exe = self._which("nvidia-smi")
            if not exe:
                raise CheckFailed(f"the step asks for {want} GPUs but nvidia-smi is not on PATH",
                                  "run on a GPU node with the NVIDIA driver (and the container toolkit), or drop gpu=")
            rc, text = self.run([exe, "-L"], self.env)
            if rc != 0:
                raise CheckFailed(f"`nvidia-smi -L` exited {rc}: {_tail(text)}",
                                  "check the NVIDIA driver on this node")
            have = sum(1 for line in text.splitlines() if re.match(r"GPU \d+:", line.strip()))
            if have < want:
                raise CheckFailed(f"the step asks for {want} GPUs but nvidia-smi lists {have}",
                                  "run on a node with that many GPUs (Slurm: --gpus-per-node), or lower gpu=")
            return f"{have} GPUs"
        return "no accelerator asked"

    def efa(self) -> str | None:
        want = int(float(self.request.get("efa") or 0))
        if want <= 0:
            return None
        exe = self._which("fi_info", extra="/opt/amazon/efa/bin")
        if not exe:
            raise CheckFailed(f"the step asks for {want} EFA interfaces but fi_info is not on PATH (nor in "
                              f"/opt/amazon/efa/bin)", "install the EFA software (aws-efa-installer) in the image")
        rc, text = self.run([exe, "-p", "efa"], self.env)
        if rc != 0:
            raise CheckFailed(f"`fi_info -p efa` exited {rc}: {_tail(text)}",
                              "attach EFA interfaces to the instance (launch template / compute environment) and "
                              "pass /dev/infiniband into the container, or drop efa=")
        domains = {re.sub(r"-(rdm|dgrm)$", "", m) for m in re.findall(r"domain:\s*(\S+)", text)}
        if domains and len(domains) < want:
            raise CheckFailed(f"the step asks for {want} EFA interfaces but fi_info lists {len(domains)} "
                              f"({', '.join(sorted(domains))})", "use an instance type with that many, or lower efa=")
        return f"efa ok ({len(domains)} interfaces)" if domains else "efa ok"

    def imports(self) -> str | None:
        if not self.entrypoint:
            return None
        is_module = self.module if self.module is not None else not self.entrypoint.endswith(".py")
        shown = f"`python -m {self.entrypoint}`" if is_module else f"the script {self.entrypoint}"
        self.pythons += 1  # one short Python that imports nothing but the standard library's importlib, ast, json
        rc, text = self.run([self.python, "-c", _IMPORTS_CODE, "module" if is_module else "script",
                             self.entrypoint], self.env)
        try:  # its last line of JSON (what an interpreter's site hooks print at exit may come after it)
            doc = next(d for line in reversed(text.strip().splitlines()) if line.startswith("{")
                       and isinstance(d := _json_or_none(line), dict))
        except StopIteration:
            raise CheckFailed(f"checking the imports of {shown} with {self.python} failed (exit {rc}): "
                              f"{_tail(text)}", "check that this Python runs on the node") from None
        if doc.get("error") == "not found":
            raise CheckFailed(f"the script {self.entrypoint} does not exist here (cwd {os.getcwd()})",
                              "give a path inside the code package or the image, or a module name")
        if doc.get("error"):
            raise CheckFailed(f"the script {self.entrypoint} cannot be parsed: {doc['error']}", "fix the script")
        if doc.get("missing"):
            names = ", ".join(doc["missing"])
            raise CheckFailed(f"{shown} needs {names}, which {self.python} on this node cannot import",
                              "install it in the image or environment the nodes run (or fix the import)")
        return "imports ok"

    def data(self) -> str | None:
        if not self.data_paths:
            return None
        for p in self.data_paths:
            path = Path(p)
            if not path.exists():
                raise CheckFailed(f"staged data {p} is missing", "check the staging step's log on this node")
            empty = path.stat().st_size == 0 if path.is_file() else not any(path.iterdir())
            if empty:
                raise CheckFailed(f"staged data {p} is empty", "check the staging step's log on this node (a full "
                                  "disk or an interrupted copy)")
        return f"data ok ({len(self.data_paths)} paths)"

    def disk(self) -> str | None:
        floor_set = bool(self.env.get(MIN_DISK_ENV))
        try:
            floor = float(self.env[MIN_DISK_ENV]) if floor_set else DEFAULT_MIN_DISK_GB
        except ValueError:
            raise ConfigError(f"{MIN_DISK_ENV}={self.env[MIN_DISK_ENV]!r}: give a number of GB, e.g. 20") from None
        if self.neuron:
            where = local_cache_dir(self.env)
            if where is None:  # s3:// cache: nothing local to fill
                return "disk: neuron cache is remote"
            what = "the Neuron compile cache"
        else:
            where = Path(self.tempdir or tempfile.gettempdir())
            what = "the task's temp folder"
            floor = floor if floor_set else 0.0
        free = self.free_bytes(str(where)) / 1e9
        if free < floor:
            raise CheckFailed(f"{what} ({where}) has {free:.1f} GB free, below the floor of {floor:g} GB",
                              f"free space there, point NEURON_COMPILE_CACHE_URL at a larger disk, or lower "
                              f"{MIN_DISK_ENV}")
        return f"disk {free:.0f} GB free"

    def all_reduce(self, nproc: int) -> str | None:
        """Every node x nproc ranks all_reduce once, on the training's backend, against the bus-bandwidth floor.
        Skipped when every node is this machine (`one_host`): it would test loopback, not a network, and its cost is
        a torchrun and nproc Pythons importing torch on every node; a floor set in $STOKER_PREFLIGHT_MIN_BUSBW_GBPS, or
        $STOKER_PREFLIGHT_ALLREDUCE=1, runs it anyway."""
        if self.allreduce_command is None:
            return None
        if self.one_host and not self.env.get(MIN_BUSBW_ENV) and self.env.get(ALLREDUCE_ENV, "") != "1":
            return "all_reduce skipped (every node is on this machine)"
        kind = "neuron" if self.neuron else "gpu" if float(self.request.get("gpu") or 0) > 0 else "cpu"
        # auto: xla on a Neuron node whose Python has torch_xla, nccl with CUDA, else gloo
        backend = "nccl" if kind == "gpu" else "auto"
        floor, source = min_busbw(self.instance_type, kind, self.env)
        timeout = float(self.env.get(TIMEOUT_ENV) or (120 if kind == "neuron" else 60))
        folder = tempfile.mkdtemp(prefix="preflight-", dir=self.tempdir)
        out = os.path.join(folder, "node.json")
        try:
            cmd = self.allreduce_command(["--sizes", MESSAGE_BYTES[kind], "--iters", "5", "--warmup", "2",
                                          "--timeout", f"{timeout:g}", "--backend", backend, "--node-out", out])
            self.pythons += 1 + nproc  # torchrun's agent and its workers
            rc = self.launch(cmd, self.env, timeout + 60)
            if rc != 0:
                raise CheckFailed(f"the all_reduce across {self.nnodes} nodes x {nproc} processes failed (torchrun "
                                  f"exited {rc}; the rank lines above say which)",
                                  "check the network between the nodes (security group, EFA) and each rank's log "
                                  "(stoker logs RUN/STEP)")
            try:
                doc = json.loads(Path(out).read_text())
                busbw = max(r["busbw_gbps"] for r in doc["results"])
            except (OSError, ValueError, KeyError):
                raise CheckFailed("the all_reduce wrote no result on this node", "check this node's log") from None
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        if busbw < floor:
            raise CheckFailed(f"all_reduce bus bandwidth {busbw:.2f} GB/s ({doc.get('backend')}, "
                              f"{doc.get('world_size')} ranks) is below the required {floor:g} GB/s ({source})",
                              "check that the gang uses EFA (FI_PROVIDER=efa, fi_info -p efa) and that its nodes "
                              f"are in one placement group, or set {MIN_BUSBW_ENV} to what this cluster gives")
        return f"all_reduce {busbw:.2f} GB/s ≥ {floor:g} ({doc.get('backend')})"

    # -- the gate ----------------------------------------------------------------------------------
    def __call__(self, nproc: int = 1) -> float:
        """Run every check; print the node's one line; raise PreflightError on the first failure. Returns the
        seconds it took."""
        t0 = self.clock()
        parts: list[str] = []
        checks: list[tuple[str, Callable[[], str | None]]] = [
            ("accelerators", self.accelerators), ("efa", self.efa), ("imports", self.imports),
            ("staged data", self.data), ("disk", self.disk), ("all_reduce", lambda: self.all_reduce(nproc))]
        for name, check in checks:
            try:
                part = check()
            except CheckFailed as e:
                took = self.clock() - t0
                self.out(f"preflight: node {self.node} ({self.host}) failed in {took:.1f} s: {name}: {e.problem}"
                         f"; {self._started()}")
                raise PreflightError(self.node, self.host, name, e.problem, e.fix) from None
            if part:
                parts.append(part)
        took = self.clock() - t0
        self.out(f"preflight: node {self.node} ({self.host}) ok in {took:.1f} s: {', '.join(parts)}; "
                 f"{self._started()}")
        return took

    def _started(self) -> str:
        return f"{self.pythons} Python{'s' if self.pythons != 1 else ''} started"

    def _which(self, name: str, extra: str = "") -> str | None:
        path = self.env.get("PATH", os.defpath) + (os.pathsep + extra if extra else "")
        return shutil.which(name, path=path)


def _json_or_none(line: str) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return None


def _tail(text: str, n: int = 300) -> str:
    t = " ".join(text.split())
    return t[-n:] if t else "(no output)"


def local_checks(doc: Mapping[str, Any], *, node: int, data_paths: Sequence[str] = (), cwd: str | None = None,
                 env: Mapping[str, str] | None = None, out: Callable[[str], None] | None = None) -> float:
    """The node-local checks of a gang's preflight (1-5: accelerators, EFA, imports, staged data, disk; not the
    all_reduce, which needs the others), as a hot spare runs them while it waits, from what node 0 published
    (`local_doc`): so a spare that could not run the training is known before it is needed, never chosen, and one
    that passed joins without a preflight. `cwd`: where a relative script entrypoint is (the code package).
    Seconds it took; raises PreflightError."""
    from stoker.distributed.accel import node_env

    request = dict(doc.get("request") or {})
    entry, module = str(doc.get("entrypoint") or ""), doc.get("module")
    is_module = module if module is not None else not entry.endswith(".py")
    if entry and not is_module and cwd and not os.path.isabs(entry):
        entry = os.path.join(cwd, entry)
    env = dict(os.environ if env is None else env)
    env.update({k: v for k, v in node_env(request, env).items() if k not in env})  # as the node's task will have
    check = Preflight(node=node, nnodes=int(doc.get("nnodes") or 2), request=request, entrypoint=entry,
                      module=module, neuron=bool(doc.get("neuron")), data_paths=[*(doc.get("paths") or []),
                                                                                *data_paths],
                      env=env, allreduce_command=None, dev_dir=env.get("STOKER_DEV_DIR") or DEV_DIR,
                      **({"out": out} if out is not None else {}))
    return check(0)


def local_doc(helper: Any, entrypoint: str, module: bool | None, env: Mapping[str, str], *,
              asked: bool | None = None, paths: Sequence[str] = ()) -> dict[str, Any] | None:
    """What a spare needs to run :func:`local_checks` as this node runs :func:`gate` (None: the preflight is off);
    the staged data is the spare's own (it stages the same inputs)."""
    if not enabled(helper.nnodes, asked, env):
        return None
    return {"request": dict(helper.request), "entrypoint": entrypoint, "module": module,
            "neuron": bool(helper.uses_neuron()), "nnodes": helper.nnodes, "paths": list(paths)}


def gate(helper: Any, entrypoint: str, module: bool | None, nproc: int, env: Mapping[str, str], *,
         asked: bool | None = None, paths: Sequence[str] = ()) -> float | None:
    """The preflight of a @torchrun node (a `distributed.torchrun.TorchrunHelper`), when it is on (`enabled`):
    the helper's request and entrypoint, the data it staged plus `paths`, and an all_reduce launched like the
    training command (same nodes, nproc_per_node and master, on master_port + PORT_OFFSET). Seconds it took,
    or None when off; raises PreflightError."""
    if not enabled(helper.nnodes, asked, env):
        return None
    from dataclasses import replace

    from stoker.distributed.accel import instance_type_here
    from stoker.flow.current import current

    side = replace(helper, master_port=helper.master_port + PORT_OFFSET, max_restarts=0)
    request = helper.request
    check = Preflight(
        node=helper.node_rank, nnodes=helper.nnodes, request=request, entrypoint=entrypoint, module=module,
        neuron=helper.uses_neuron(), instance_type=request.get("instance_type") or instance_type_here(),
        data_paths=[*paths, *(s.path for s in getattr(helper, "staged", []))], env=env,
        allreduce_command=lambda extra: side.command("stoker.train.collectives", extra, True, nproc),
        one_host=on_this_host(helper.master_addr), tempdir=current.get("tempdir"),
        dev_dir=env.get("STOKER_DEV_DIR") or DEV_DIR)
    return check(nproc)
