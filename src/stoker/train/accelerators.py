"""One small interface over the accelerators stoker trains on: ``cpu`` (gloo), ``cuda`` (nccl) and
``neuron`` (Trainium through torch-xla, imported only when the Neuron SDK is installed).

    acc = detect()                       # "auto": cuda if present, else neuron if present, else cpu
    device = acc.device(local_rank)      # where this rank's tensors live
    dist.init_process_group(acc.dist_backend)
    peak = acc.peak_flops(torch.bfloat16)   # dense FLOP/s of one device (None on CPU)

Peak numbers are dense (no structured sparsity) tensor-core FLOP/s from the vendors' data sheets, per
device that one rank drives: one GPU, or one NeuronCore (a *logical* core on trn2, which groups
``NEURON_LOGICAL_NC_CONFIG`` physical cores, 2 by default).
"""

from __future__ import annotations

import logging
import os
import resource
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from stoker.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = ["Accelerator", "CPUAccelerator", "CUDAAccelerator", "NeuronAccelerator", "detect",
           "PEAK_FLOPS", "gpu_peak_flops", "neuron_peak_flops"]

T = 1e12
# Dense FLOP/s per device by dtype key ("bf16", "fp16", "tf32", "fp32"). "fp32" is the plain (CUDA-core /
# vector) rate; "tf32" the tensor-core rate used by matmuls when TF32 is allowed.
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "B200": {"bf16": 2250 * T, "fp16": 2250 * T, "tf32": 1100 * T, "fp32": 80 * T},
    "H200": {"bf16": 989 * T, "fp16": 989 * T, "tf32": 494.5 * T, "fp32": 67 * T},
    "H100-SXM": {"bf16": 989 * T, "fp16": 989 * T, "tf32": 494.5 * T, "fp32": 67 * T},
    "H100-NVL": {"bf16": 835 * T, "fp16": 835 * T, "tf32": 417.5 * T, "fp32": 60 * T},
    "H100-PCIe": {"bf16": 756 * T, "fp16": 756 * T, "tf32": 378 * T, "fp32": 51 * T},
    "A100": {"bf16": 312 * T, "fp16": 312 * T, "tf32": 156 * T, "fp32": 19.5 * T},
    "L40S": {"bf16": 362 * T, "fp16": 362 * T, "tf32": 183 * T, "fp32": 91.6 * T},
    "L4": {"bf16": 121 * T, "fp16": 121 * T, "tf32": 60 * T, "fp32": 30.3 * T},
    # AWS's A10G: NVIDIA publishes no separate sheet; this is the A10 sheet (as Lightning's table uses).
    "A10G": {"bf16": 125 * T, "fp16": 125 * T, "tf32": 62.5 * T, "fp32": 31.2 * T},
    "A10": {"bf16": 125 * T, "fp16": 125 * T, "tf32": 62.5 * T, "fp32": 31.2 * T},
    # One physical NeuronCore. trn1: a Trainium chip = 2 NeuronCore-v2, 190 TF bf16 / 47.5 TF fp32.
    # trn2: a Trainium2 chip = 8 NeuronCore-v3, 667 TF bf16 / 181 TF fp32.
    "trn1": {"bf16": 95 * T, "fp16": 95 * T, "tf32": 23.75 * T, "fp32": 23.75 * T},
    "trn2": {"bf16": 83.375 * T, "fp16": 83.375 * T, "tf32": 22.625 * T, "fp32": 22.625 * T},
}

# (substring of torch.cuda.get_device_name(), table key); first match wins, so longer names come first.
_GPU_NAMES: list[tuple[str, str]] = [
    ("B200", "B200"), ("H200", "H200"),
    ("H100 NVL", "H100-NVL"), ("H100 PCIE", "H100-PCIe"), ("H100", "H100-SXM"),
    ("A100", "A100"), ("L40S", "L40S"), ("L4", "L4"), ("A10G", "A10G"), ("A10", "A10"),
]


def _dtype_key(dtype: torch.dtype | str) -> str:
    keys = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
            "bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16", "half": "fp16",
            "float32": "fp32", "fp32": "fp32", "float": "fp32", "tf32": "tf32", "tfloat32": "tf32"}
    try:
        return keys[dtype]
    except (KeyError, TypeError):
        raise ConfigError(f"peak_flops: unknown dtype {dtype!r}; use torch.bfloat16, torch.float16, "
                          "torch.float32 or 'tf32'") from None


def gpu_peak_flops(device_name: str, dtype: torch.dtype | str = torch.bfloat16) -> float | None:
    """Dense peak FLOP/s of the GPU called ``device_name`` (as ``torch.cuda.get_device_name`` spells it),
    or ``None`` for a GPU not in :data:`PEAK_FLOPS`."""
    key = _dtype_key(dtype)
    upper = device_name.upper()
    for needle, model in _GPU_NAMES:
        if needle.upper() in upper:
            return PEAK_FLOPS[model][key]
    return None


def neuron_peak_flops(kind: str, dtype: torch.dtype | str = torch.bfloat16, cores_per_rank: int = 1) -> float:
    """Dense peak FLOP/s of the NeuronCore one rank drives on a ``trn1`` or ``trn2`` instance; on trn2 a
    logical core groups ``cores_per_rank`` physical cores."""
    if kind not in ("trn1", "trn2"):
        raise ConfigError(f"neuron_peak_flops: unknown Trainium generation {kind!r}; use 'trn1' or 'trn2'")
    return PEAK_FLOPS[kind][_dtype_key(dtype)] * cores_per_rank


@dataclass
class Accelerator:
    """What a training process needs to know about the device it drives. Use :func:`detect`."""

    name: str = "cpu"
    device_type: str = "cpu"
    dist_backend: str = "gloo"
    device_name: str = "cpu"
    extra: dict[str, Any] = field(default_factory=dict)

    def device(self, local_rank: int | None = None) -> torch.device:
        """The torch device of the process with ``local_rank`` (default: ``$LOCAL_RANK`` or 0)."""
        return torch.device(self.device_type)

    @property
    def supports_bf16(self) -> bool:
        """Whether bf16 compute (autocast / bf16 parameters) is supported."""
        return True

    def peak_flops(self, dtype: torch.dtype | str = torch.bfloat16) -> float | None:
        """Dense peak FLOP/s of one device for ``dtype``; ``None`` when unknown (always on CPU)."""
        _dtype_key(dtype)  # validates
        return None

    def memory_stats(self) -> dict[str, int]:
        """Memory of this process's device: ``used_bytes``, ``peak_bytes``, ``total_bytes`` (+ extras)."""
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait until queued device work is done (before reading a timer)."""

    def set_device(self, local_rank: int | None = None) -> torch.device:
        """Make this process's device current (CUDA) and return it."""
        return self.device(local_rank)


def _local_rank(local_rank: int | None) -> int:
    return int(os.environ.get("LOCAL_RANK", "0")) if local_rank is None else int(local_rank)


class CPUAccelerator(Accelerator):
    """CPU with the gloo backend; memory is the process's resident set."""

    def __init__(self) -> None:
        super().__init__(name="cpu", device_type="cpu", dist_backend="gloo", device_name="cpu")

    def memory_stats(self) -> dict[str, int]:
        import psutil

        rss = psutil.Process().memory_info().rss
        # ru_maxrss is KiB on Linux and bytes on macOS
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
        return {"used_bytes": int(rss), "peak_bytes": int(max(peak, rss)),
                "total_bytes": int(psutil.virtual_memory().total)}


class CUDAAccelerator(Accelerator):
    """NVIDIA GPUs with the nccl backend; one GPU per rank (``cuda:LOCAL_RANK``)."""

    def __init__(self) -> None:
        if not torch.cuda.is_available():
            raise ConfigError("accelerator 'cuda': torch.cuda.is_available() is False (no GPU, or a CPU-only "
                              "torch build); install a CUDA build of torch or use --accelerator cpu")
        super().__init__(name="cuda", device_type="cuda", dist_backend="nccl",
                         device_name=torch.cuda.get_device_name(0))

    def device(self, local_rank: int | None = None) -> torch.device:
        return torch.device("cuda", _local_rank(local_rank) % max(torch.cuda.device_count(), 1))

    def set_device(self, local_rank: int | None = None) -> torch.device:
        dev = self.device(local_rank)
        torch.cuda.set_device(dev)
        return dev

    @property
    def supports_bf16(self) -> bool:
        return bool(torch.cuda.is_bf16_supported())

    def peak_flops(self, dtype: torch.dtype | str = torch.bfloat16) -> float | None:
        peak = gpu_peak_flops(torch.cuda.get_device_name(torch.cuda.current_device()), dtype)
        if peak is None:
            log.warning("no peak FLOP/s known for GPU %r; MFU will not be reported", self.device_name)
        return peak

    def memory_stats(self) -> dict[str, int]:
        dev = torch.cuda.current_device()
        free, total = torch.cuda.mem_get_info(dev)
        return {"used_bytes": int(torch.cuda.memory_allocated(dev)),
                "peak_bytes": int(torch.cuda.max_memory_allocated(dev)),
                "reserved_bytes": int(torch.cuda.memory_reserved(dev)),
                "free_bytes": int(free), "total_bytes": int(total)}

    def synchronize(self) -> None:
        torch.cuda.synchronize()


def _trainium_kind() -> str:
    """'trn1' or 'trn2', from $STOKER_NEURON_KIND or the EC2 instance type (DMI product name)."""
    kind = os.environ.get("STOKER_NEURON_KIND", "")
    if not kind:
        try:
            with open("/sys/devices/virtual/dmi/id/product_name") as f:
                kind = f.read().strip()
        except OSError:
            kind = ""
    return "trn2" if kind.lower().startswith("trn2") else "trn1"


class NeuronAccelerator(Accelerator):
    """AWS Trainium through torch-xla (torch-neuronx); one NeuronCore per rank, the ``xla`` backend."""

    def __init__(self) -> None:
        try:
            import torch_xla  # noqa: F401
            import torch_xla.core.xla_model as xm
        except ImportError as e:
            raise ConfigError(
                "accelerator 'neuron': torch_xla is not importable (" + str(e) + "); install the Neuron SDK "
                "(pip install torch-neuronx --extra-index-url https://pip.repos.neuron.amazonaws.com) on a "
                "Trainium instance, or use --accelerator cpu/cuda") from e
        self._xm = xm
        kind = _trainium_kind()
        lnc = int(os.environ.get("NEURON_LOGICAL_NC_CONFIG", "2" if kind == "trn2" else "1"))
        super().__init__(name="neuron", device_type="xla", dist_backend="xla", device_name=kind,
                         extra={"cores_per_rank": lnc})

    def device(self, local_rank: int | None = None) -> torch.device:
        # torch-xla binds the process to its NeuronCore from the runtime's env (NEURON_RT_VISIBLE_CORES)
        return self._xm.xla_device()

    def peak_flops(self, dtype: torch.dtype | str = torch.bfloat16) -> float | None:
        return neuron_peak_flops(self.device_name, dtype, int(self.extra.get("cores_per_rank", 1)))

    def memory_stats(self) -> dict[str, int]:
        info = self._xm.get_memory_info(self.device())
        if "bytes_used" in info:  # torch-xla >= 2.5
            used, total = int(info["bytes_used"]), int(info["bytes_limit"])
        else:
            total = int(info.get("kb_total", 0)) * 1024
            used = total - int(info.get("kb_free", 0)) * 1024
        return {"used_bytes": used, "peak_bytes": int(info.get("peak_bytes_used", used)), "total_bytes": total}

    def synchronize(self) -> None:
        self._xm.mark_step()
        self._xm.wait_device_ops()


def _neuron_present() -> bool:
    if not os.path.exists("/dev/neuron0"):
        return False
    import importlib.util

    return importlib.util.find_spec("torch_xla") is not None


def detect(name: str = "auto") -> Accelerator:
    """The accelerator called ``name`` (``cpu``, ``cuda``, ``neuron``, or ``auto``: cuda when a GPU is
    visible, else neuron when a Neuron device and torch-xla are present, else cpu). ``$STOKER_ACCELERATOR``
    overrides ``auto``. Raises ConfigError when the named accelerator is not usable here."""
    choice = (name or "auto").lower()
    if choice == "auto":
        choice = os.environ.get("STOKER_ACCELERATOR", "auto").lower()
    if choice == "auto":
        if torch.cuda.is_available():
            choice = "cuda"
        elif _neuron_present():
            choice = "neuron"
        else:
            choice = "cpu"
    if choice in ("cuda", "gpu"):
        return CUDAAccelerator()
    if choice in ("neuron", "trainium", "xla"):
        return NeuronAccelerator()
    if choice == "cpu":
        return CPUAccelerator()
    raise ConfigError(f"unknown accelerator {name!r}; use one of: auto, cpu, cuda, neuron")
