"""Host facts and samplers that need no accelerator library: CPU, memory, visible GPUs."""

from __future__ import annotations

import os
import shutil
import subprocess


def local_gpu_count() -> int:
    """NVIDIA GPUs visible to this process (CUDA_VISIBLE_DEVICES, else nvidia-smi), without importing torch."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))
