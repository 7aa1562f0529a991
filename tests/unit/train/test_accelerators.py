"""The accelerator interface on this machine (CPU) and its peak-FLOP/s tables."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from stoker.errors import ConfigError
from stoker.train.accelerators import (
    PEAK_FLOPS,
    CPUAccelerator,
    detect,
    gpu_peak_flops,
    neuron_peak_flops,
)


def test_detect_cpu():
    acc = detect("cpu")
    assert isinstance(acc, CPUAccelerator)
    assert (acc.name, acc.device_type, acc.dist_backend) == ("cpu", "cpu", "gloo")
    assert acc.device(3) == torch.device("cpu")
    assert acc.supports_bf16 is True
    assert acc.peak_flops(torch.bfloat16) is None
    acc.synchronize()


def test_auto_on_this_machine_matches_hardware(monkeypatch):
    monkeypatch.delenv("STOKER_ACCELERATOR", raising=False)
    acc = detect()
    assert acc.name == ("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setenv("STOKER_ACCELERATOR", "cpu")
    assert detect("auto").name == "cpu"


def test_cpu_memory_stats_track_an_allocation():
    acc = detect("cpu")
    before = acc.memory_stats()
    assert set(before) >= {"used_bytes", "peak_bytes", "total_bytes"}
    assert 0 < before["used_bytes"] <= before["peak_bytes"] <= before["total_bytes"]
    big = torch.ones(64 * 1024 * 1024 // 4)  # 64 MiB, touched
    after = acc.memory_stats()
    assert after["used_bytes"] >= before["used_bytes"] + 48 * 1024 * 1024
    assert after["peak_bytes"] >= after["used_bytes"] - 4096
    del big


def test_gpu_table_lookup_by_device_name():
    assert gpu_peak_flops("NVIDIA H100 80GB HBM3", torch.bfloat16) == 989e12
    assert gpu_peak_flops("NVIDIA H100 PCIe", "bf16") == 756e12
    assert gpu_peak_flops("NVIDIA H100 NVL", torch.float16) == 835e12
    assert gpu_peak_flops("NVIDIA H200", torch.bfloat16) == 989e12
    assert gpu_peak_flops("NVIDIA B200", torch.bfloat16) == 2250e12
    assert gpu_peak_flops("NVIDIA A100-SXM4-80GB", torch.bfloat16) == 312e12
    assert gpu_peak_flops("NVIDIA A100-SXM4-40GB", torch.float32) == 19.5e12
    assert gpu_peak_flops("NVIDIA A100-SXM4-40GB", "tf32") == 156e12
    assert gpu_peak_flops("NVIDIA L4", torch.bfloat16) == 121e12
    assert gpu_peak_flops("NVIDIA L40S", torch.bfloat16) == 362e12  # not mistaken for an L4
    assert gpu_peak_flops("NVIDIA A10G", torch.bfloat16) == 125e12
    assert gpu_peak_flops("Tesla T4", torch.bfloat16) is None
    for row in PEAK_FLOPS.values():
        assert row["bf16"] >= row["fp32"] > 0


def test_neuron_table():
    # trn1: 190 TF bf16 per chip of 2 cores; trn2: 667 TF per chip of 8 cores, logical core = 2 by default
    assert neuron_peak_flops("trn1", torch.bfloat16) == pytest.approx(95e12)
    assert neuron_peak_flops("trn2", torch.bfloat16, cores_per_rank=2) == pytest.approx(667e12 / 4)
    with pytest.raises(ConfigError, match="trn1"):
        neuron_peak_flops("inf2")


@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is not None, reason="torch_xla installed here")
def test_neuron_without_torch_xla_is_a_clear_error():
    with pytest.raises(ConfigError, match="torch-neuronx"):
        detect("neuron")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible here")
def test_cuda_without_gpu_is_a_clear_error():
    with pytest.raises(ConfigError, match="--accelerator cpu"):
        detect("cuda")


def test_unknown_names_are_config_errors():
    with pytest.raises(ConfigError, match="auto, cpu, cuda, neuron"):
        detect("tpu")
    with pytest.raises(ConfigError, match="dtype"):
        detect("cpu").peak_flops(torch.int8)
