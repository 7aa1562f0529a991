"""What a node has and what its processes need: accelerator detection, the EFA / Neuron environment, and
the number of torchrun processes per node.

A step asks for devices with `@resources(...)` or a backend decorator such as `@batch(...)` (each count is
the larger of the two, as in Metaflow). On the node, stoker also looks at what is really there:
- Neuron devices: `/dev/neuron0..N`; NeuronCores from `neuron-ls --json-output` when it is installed, else
  devices x NeuronCores per device of the instance type (`instance_type=` on the step, or the EC2 type the
  node reports in `/sys/devices/virtual/dmi/id/product_name`), else 2 per device, said so;
- GPUs: `CUDA_VISIBLE_DEVICES` when set, else `nvidia-smi -L`.

The instance knowledge below is deliberately small and local: runtime/ must not import backends/.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

DEV_DIR = "/dev"  # where the preflight counts device files; STOKER_DEV_DIR moves it (the Batch emulation's nodes)
DMI_PRODUCT = "/sys/devices/virtual/dmi/id/product_name"  # the EC2 instance type on Nitro instances
NEURON_CACHE_DIR = "/var/tmp/neuron-compile-cache"  # the Neuron SDK's own default
ASSUMED_CORES_PER_DEVICE = 2  # trn1 / inf2

EFA_ENV = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1"}
# What the Neuron samples' NxD recipes set for training; XLA_* precision switches and NEURON_RT_NUM_CORES are
# the user's choice (@environment), never ours.
NEURON_ENV = {"NEURON_FUSE_SOFTMAX": "1", "NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS": "3",
              "MALLOC_ARENA_MAX": "64"}
# What NxD's training scripts export for the compiler (examples/training/llama/tp_zero1_llama_hf_pretrain/*.sh,
# Neuron 2.22 and later: `--distribution-strategy=llm-training` was dropped from them then). Trainium only: an
# Inferentia step is inference, which this flag does not describe. A user's NEURON_CC_FLAGS replaces it whole.
NEURON_TRAINING_ENV = {"NEURON_CC_FLAGS": "--model-type transformer"}
COUNT_KEYS = ("cpu", "gpu", "trainium", "inferentia", "efa")

Runner = Callable[[list[str]], "str | None"]  # argv -> stdout, None when the command failed


def cores_per_device(instance_type: str | None, env: Mapping[str, str] | None = None) -> int | None:
    """NeuronCores per Neuron device of an instance type, as torchrun ranks see them (None: not known)."""
    if not instance_type:
        return None
    family = instance_type.split(".")[0]
    if family.startswith(("trn1", "inf2")):
        return 2
    if family.startswith("trn2"):  # 8 physical cores per chip, grouped 2 by 2 (LNC=2) unless told otherwise
        lnc = (env or {}).get("NEURON_LOGICAL_NC_CONFIG") or "2"
        return 8 // (1 if lnc.strip() == "1" else 2)
    if family == "inf1":
        return 4
    return None


def step_request(resources: Mapping[str, Any] | None, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What one node of a step asks for: each count the larger of @resources and the backend decorator's
    (e.g. @batch), plus the backend decorator's `instance_type`. Only keys with a value are returned."""
    out: dict[str, Any] = {}
    for k in COUNT_KEYS:
        vals = [float(d[k]) for d in (resources or {}, options or {}) if d.get(k)]
        if vals:
            out[k] = max(vals)
    itype = (options or {}).get("instance_type") or (resources or {}).get("instance_type")
    if itype:
        out["instance_type"] = str(itype)
    return out


def request_label(key: str, resources: Mapping[str, Any] | None, options: Mapping[str, Any] | None,
                  backend: str = "batch") -> str:
    """`@batch(trainium=16)` or `@resources(trainium=16)`: the decorator whose value `step_request` kept."""
    r, o = (resources or {}).get(key) or 0, (options or {}).get(key) or 0
    name, v = (backend, o) if float(o) >= float(r) else ("resources", r)
    return f"@{name}({key}={float(v):g})"


@dataclass(frozen=True)
class Accelerators:
    """What this node has. `*_source` says how it was found (printed next to nproc_per_node)."""

    neuron_devices: int = 0
    neuron_cores: int = 0
    cores_per_device: int = 0
    neuron_source: str = ""
    instance_type: str | None = None
    gpus: int = 0
    gpu_source: str = ""


def _run(argv: list[str]) -> str | None:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout if p.returncode == 0 else None


def neuron_device_count(dev_dir: str = DEV_DIR) -> int:
    """How many `/dev/neuronN` devices this node (or container) has."""
    try:
        return sum(1 for n in os.listdir(dev_dir) if re.fullmatch(r"neuron\d+", n))
    except OSError:
        return 0


def instance_type_here(dmi_path: str = DMI_PRODUCT) -> str | None:
    """The EC2 instance type this node reports (Nitro instances expose it as the DMI product name)."""
    try:
        with open(dmi_path) as f:
            name = f.read().strip()
    except OSError:
        return None
    return name if re.fullmatch(r"[a-z][a-z0-9-]*\.[a-z0-9-]+", name) else None


def parse_neuron_ls(text: str) -> list[int] | None:
    """NeuronCores per device from `neuron-ls --json-output` (a list of devices with `nc_count`)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if isinstance(data, dict):
        data = data.get("neuron_devices") or data.get("devices") or []
    if not isinstance(data, list):
        return None
    cores = [int(d["nc_count"]) for d in data if isinstance(d, dict) and d.get("nc_count")]
    return cores or None


def gpu_count(env: Mapping[str, str], run: Runner = _run) -> tuple[int, str]:
    """GPUs visible here: `CUDA_VISIBLE_DEVICES` when set, else the `GPU n:` lines of `nvidia-smi -L`."""
    if "CUDA_VISIBLE_DEVICES" in env:
        value = env["CUDA_VISIBLE_DEVICES"].strip()
        ids = [] if value in ("", "-1", "NoDevFiles") else [i for i in value.split(",") if i.strip()]
        return len(ids), f"CUDA_VISIBLE_DEVICES={value}"
    exe = shutil.which("nvidia-smi", path=env.get("PATH"))
    out = run([exe, "-L"]) if exe else None
    if out is None:
        return 0, "no GPU (nvidia-smi not found or failed)"
    n = sum(1 for line in out.splitlines() if re.match(r"GPU \d+:", line.strip()))
    return n, f"{n} GPUs from nvidia-smi -L"


def detect(env: Mapping[str, str] | None = None, *, dev_dir: str = DEV_DIR, dmi_path: str = DMI_PRODUCT,
           run: Runner = _run, instance_type: str | None = None) -> Accelerators:
    """Look at this node: Neuron devices and cores, GPUs. `instance_type` (from the step) beats the DMI name."""
    env = os.environ if env is None else env
    devices = neuron_device_count(dev_dir)
    itype = instance_type or instance_type_here(dmi_path)
    cores, per, source = 0, 0, ""
    exe = shutil.which("neuron-ls", path=env.get("PATH"))
    listed = parse_neuron_ls(run([exe, "--json-output"]) or "") if exe else None
    if listed:
        cores, per = sum(listed), max(listed)
        source = f"neuron-ls: {len(listed)} devices x {per} NeuronCores"
        devices = max(devices, len(listed))
    elif devices:
        known = cores_per_device(itype, env)
        per = known or ASSUMED_CORES_PER_DEVICE
        cores = devices * per
        why = (f"{itype}" if known else f"assumed for trn1/inf2; {itype or 'the instance type'} is not known here: "
               f"set instance_type= on @batch or @torchrun(nproc_per_node=...)")
        source = f"{devices} {dev_dir}/neuron* devices x {per} NeuronCores ({why})"
    gpus, gsrc = gpu_count(env, run)
    return Accelerators(neuron_devices=devices, neuron_cores=cores, cores_per_device=per, neuron_source=source,
                        instance_type=itype, gpus=gpus, gpu_source=gsrc)


def node_env(resources: Mapping[str, Any], env: Mapping[str, str] | None = None, *,
             neuron_devices: int | None = None) -> dict[str, str]:
    """The variables to set on a node for a step's request (`step_request(...)`), leaving alone every
    variable already in `env` (the user's value wins).

    efa > 0: `FI_PROVIDER=efa FI_EFA_USE_DEVICE_RDMA=1 FI_EFA_FORK_SAFE=1`. trainium / inferentia > 0, or Neuron
    devices on the node (`neuron_devices`, counted in /dev when None): `NEURON_ENV`, `NEURON_TRAINING_ENV` (not for
    an Inferentia step) and the compile cache folder (`NEURON_COMPILE_CACHE_URL`, unless `--cache_dir` in
    `NEURON_CC_FLAGS` or the URL is already set). The interface of the collectives (`CCOM_SOCKET_IFNAME`) is
    the engine's to know: the Batch backend sets it.
    """
    env = os.environ if env is None else env
    want: dict[str, str] = {}
    if float(resources.get("efa") or 0) > 0:
        want.update(EFA_ENV)
    neuron = float(resources.get("trainium") or 0) > 0 or float(resources.get("inferentia") or 0) > 0
    if not neuron:
        neuron = (neuron_device_count() if neuron_devices is None else neuron_devices) > 0
    if neuron:
        want.update(NEURON_ENV)
        if not float(resources.get("inferentia") or 0) > 0:
            want.update(NEURON_TRAINING_ENV)
        if "--cache_dir" not in env.get("NEURON_CC_FLAGS", ""):
            want["NEURON_COMPILE_CACHE_URL"] = NEURON_CACHE_DIR
    return {k: v for k, v in want.items() if k not in env}


def wants_neuron(request: Mapping[str, Any], dev_dir: str = DEV_DIR) -> bool:
    """Whether a step runs with Neuron devices here: it asked for them, or the node has them."""
    asked = float(request.get("trainium") or 0) > 0 or float(request.get("inferentia") or 0) > 0
    return asked or neuron_device_count(dev_dir) > 0


def nproc_problem(n: int, request: Mapping[str, Any], env: Mapping[str, str] | None = None) -> str | None:
    """Why `n` processes per node cannot run on what the step asks for (`step_request(...)`), or None: one process
    per GPU, one per NeuronCore (devices x NeuronCores per device of the instance type, when it is known)."""
    if req_gpu := int(float(request.get("gpu") or 0)):
        if n > req_gpu:
            return (f"{n} processes per node, but the step asks for {req_gpu} GPUs a node (one process per GPU): "
                    f"set nproc_per_node to at most {req_gpu}, or ask for more GPUs")
    for kind in ("trainium", "inferentia"):
        devices = int(float(request.get(kind) or 0))
        per = cores_per_device(request.get("instance_type"), env)
        if devices and per and n > devices * per:
            return (f"{n} processes per node, but {devices} {kind} devices of a {request['instance_type']} have "
                    f"{devices * per} NeuronCores (one process per core): set nproc_per_node to at most "
                    f"{devices * per}")
    return None


def nproc_for(resources: Mapping[str, Any] | None, options: Mapping[str, Any] | None,
              detected: Callable[[], Accelerators], env: Mapping[str, str] | None = None,
              backend: str = "batch") -> tuple[int, str]:
    """Processes per node and why (see `torchrun.derive_nproc_per_node`)."""
    req = step_request(resources, options)
    if req.get("gpu"):
        return int(req["gpu"]), request_label("gpu", resources, options, backend)
    for kind in ("trainium", "inferentia"):
        if req.get(kind):
            devices = int(req[kind])
            label = request_label(kind, resources, options, backend)
            per = cores_per_device(req.get("instance_type"), env)
            if per:
                return devices * per, f"{label} x {per} NeuronCores per device ({req['instance_type']})"
            acc = detected()
            if acc.cores_per_device:
                return devices * acc.cores_per_device, (f"{label} x {acc.cores_per_device} NeuronCores per "
                                                        f"device, detected: {acc.neuron_source}")
            return devices * ASSUMED_CORES_PER_DEVICE, (
                f"{label} x {ASSUMED_CORES_PER_DEVICE} NeuronCores per device, assumed (trn1/inf2): no "
                f"instance_type and no Neuron device seen here; set instance_type= or nproc_per_node=")
    if req.get("cpu"):
        return max(1, int(req["cpu"])), request_label("cpu", resources, options, backend)
    acc = detected()
    if acc.neuron_cores:
        return acc.neuron_cores, f"no @resources; detected {acc.neuron_source}"
    if acc.gpus:
        return acc.gpus, f"no @resources; detected {acc.gpu_source}"
    return 1, ("no @resources and no GPU or Neuron device on this node; set @torchrun(nproc_per_node=...) "
               "or @resources(...) for more")


def on_this_host(addr: str) -> bool:
    """Whether a rendezvous address can only be this machine (a loopback address, `localhost`): then every node of
    the gang runs here."""
    import ipaddress

    if addr.strip().lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(addr.strip("[]")).is_loopback
    except ValueError:
        return False
