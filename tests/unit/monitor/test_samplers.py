"""@monitor's samplers: neuron-monitor's JSON (recorded lines written from its documented schema, and a stand-in
executable, since no Neuron tools run here), NVML through an injected fake `pynvml` module object (no GPU here:
the fake answers like nvidia-ml-py does, including per-field NotSupported errors), and psutil on a real process
tree. The Monitor writes its samples into a real local store."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from stoker.errors import ConfigError
from stoker.flow.decorators import parse_with
from stoker.monitor.monitor import MAX_FAILURES, Monitor, build_samplers, chunk_seconds
from stoker.monitor.samplers import (
    NeuronMonitorSampler,
    NvmlSampler,
    ProcessTreeSampler,
    neuron_monitor_config,
    parse_neuron_report,
    visible_gpu_indices,
)
from stoker.store.blobs import LocalBlobStore
from stoker.store.series import read_series, series_prefix

DATA = Path(__file__).resolve().parents[2] / "data" / "neuron_monitor"
RECORDED = [json.loads(line) for line in (DATA / "trn_samples.jsonl").read_text().splitlines()]
MiB = 1024 * 1024


# ---- neuron-monitor ----------------------------------------------------------------------------------------

def test_parse_two_workers_on_trn1():
    n = parse_neuron_report(RECORDED[0])
    assert [(c["index"], c["util"]) for c in n["cores"]] == [(0, 87.2), (1, 91.5), (2, 85.0), (3, 0.0)]
    assert n["device_mem_used_mb"] == round(2 * 12519788544 / MiB)
    assert n["host_mem_used_mb"] == round(2 * 6997643264 / MiB)
    assert n["vcpu_util"] == 60.1, "100 - idle 39.36 - io_wait 0.5 of the system's average vCPU usage"
    assert n["device_mem_total_mb"] == 16 * 32768


def test_parse_keeps_only_the_task_tree_unless_none_matches():
    assert [c["index"] for c in parse_neuron_report(RECORDED[0], pids={4243})["cores"]] == [2, 3]
    assert [c["index"] for c in parse_neuron_report(RECORDED[0], pids={1, 2})["cores"]] == [0, 1, 2, 3]
    n = parse_neuron_report(RECORDED[1], pids={4242})
    assert [c["index"] for c in n["cores"]] == [0, 1], "pid 9999 is another application"
    assert "device_mem_used_mb" not in n, "the memory_used group failed: no made-up zero"


def test_parse_idle_node_trn2_v3d_dead_app_and_garbage():
    idle = parse_neuron_report(RECORDED[2])
    assert idle["cores"] == [] and idle["vcpu_util"] == 0.8
    trn2 = parse_neuron_report(RECORDED[3])
    assert [(c["index"], c["util"]) for c in trn2["cores"]] == [(0, 42.0), (1, 42.0)]
    assert trn2["vcpu_util"] == 15.0, "no system vcpu_usage group: the application's user + system"
    assert trn2["device_mem_total_mb"] == 16 * 98304
    assert parse_neuron_report({}) is None
    assert parse_neuron_report({"neuron_runtime_data": [{"pid": 1, "error": "x", "report": {}}]}) is None


def test_config_asks_only_for_what_is_parsed():
    cfg = neuron_monitor_config(0.2)
    assert cfg["period"] == "1s" and neuron_monitor_config(5)["period"] == "5s"
    types = {m["type"] for m in cfg["neuron_runtimes"][0]["metrics"]}
    assert types == {"neuroncore_counters", "memory_used", "neuron_runtime_vcpu_usage"}
    assert {m["type"] for m in cfg["system_metrics"]} == {"vcpu_usage", "memory_info"}


def _fake_exe(tmp_path: Path) -> str:
    exe = tmp_path / "neuron-monitor"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {DATA / 'fake_neuron_monitor.py'} \"$@\"\n")
    exe.chmod(0o755)
    return str(exe)


def test_sampler_reads_the_stream_of_a_running_neuron_monitor(tmp_path):
    s = NeuronMonitorSampler(1.0, _fake_exe(tmp_path))
    try:
        rec: dict = {}
        deadline = time.time() + 10
        while "neuron" not in rec and time.time() < deadline:
            s.sample(rec)
            time.sleep(0.05)
        assert [c["index"] for c in rec["neuron"]["cores"]] == [0, 1, 2, 3]
        assert s.bad_lines == 0
        pid = s.proc.pid
    finally:
        s.close()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not os.path.exists(s.config_path), "the config file is removed"


def test_sampler_reports_a_neuron_monitor_that_died(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_NEURON_MONITOR_MODE", "garbage")
    s = NeuronMonitorSampler(1.0, _fake_exe(tmp_path))
    try:
        s.proc.wait(timeout=10)
        s._reader.join(timeout=5)
        assert s.bad_lines == 1, "the torn line is skipped, not raised"
        with pytest.raises(RuntimeError, match="exited with code 2: neuron-monitor: failed to connect"):
            s.sample({})
    finally:
        s.close()


def test_neuron_monitor_process_is_not_part_of_the_task_tree(tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_NEURON_MONITOR", _fake_exe(tmp_path))
    warnings: list[str] = []
    tree, nm = build_samplers(1.0, gpu=False, neuron=True, warn=warnings.append)
    try:
        assert (tree.name, nm.name) == ("cpu", "neuron") and not warnings
        tree._refresh(time.monotonic())
        assert nm.proc.pid in {c.pid for c in psutil.Process().children()}
        assert nm.proc.pid not in tree.pids, "the monitor's own helper does not count as the task's CPU"
    finally:
        nm.close()


def test_missing_neuron_monitor_gives_one_warning(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("STOKER_NEURON_MONITOR", raising=False)
    warnings: list[str] = []
    samplers = build_samplers(1.0, gpu=False, neuron=True, warn=warnings.append)
    assert [s.name for s in samplers] == ["cpu"]
    assert len(warnings) == 1 and "neuron-monitor was not found" in warnings[0]
    assert build_samplers(1.0, gpu=False, neuron=None, warn=warnings.append) and len(warnings) == 1, \
        "auto mode on a node without /dev/neuron*: no warning"


# ---- NVML (fake pynvml module object) ------------------------------------------------------------------------

class NotSupported(Exception):
    """Like pynvml.NVMLError_NotSupported."""


def fake_pynvml(count: int = 2, broken: bool = False, no_power: set[int] = frozenset()) -> SimpleNamespace:
    calls: list[str] = []

    def util(h):
        if broken:
            raise NotSupported("util")
        return SimpleNamespace(gpu=10 * (h + 1), memory=5)

    def mem(h):
        if broken:
            raise NotSupported("mem")
        return SimpleNamespace(total=80 * 1024 * MiB, used=(h + 1) * 1024 * MiB, free=0)

    def power(h):
        if broken or h in no_power:
            raise NotSupported("power")
        return 312_400 + h * 1000  # milliwatts

    def temp(h, sensor):
        if broken:
            raise NotSupported("temp")
        assert sensor == 0
        return 60 + h

    return SimpleNamespace(
        calls=calls, NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: calls.append("init"), nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: count, nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUtilizationRates=util, nvmlDeviceGetMemoryInfo=mem, nvmlDeviceGetPowerUsage=power,
        nvmlDeviceGetTemperature=temp)


def test_nvml_sampler_per_device(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nv = fake_pynvml(no_power={1})
    s = NvmlSampler(nv)
    rec: dict = {}
    s.sample(rec)
    assert rec["gpus"] == [
        {"index": 0, "util": 10, "mem_used_mb": 1024, "mem_total_mb": 81920, "power_w": 312, "temp_c": 60},
        {"index": 1, "util": 20, "mem_used_mb": 2048, "mem_total_mb": 81920, "temp_c": 61},
    ], "a field NVML does not support is left out, not zero"
    s.close()
    assert nv.calls == ["init", "shutdown"]


def test_nvml_follows_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    rec: dict = {}
    NvmlSampler(fake_pynvml(count=4)).sample(rec)
    assert [g["index"] for g in rec["gpus"]] == [1]
    assert visible_gpu_indices(4, {"CUDA_VISIBLE_DEVICES": "3,0,-1,2"}) == [3, 0]
    assert visible_gpu_indices(2, {"CUDA_VISIBLE_DEVICES": "GPU-8d3f,GPU-1a2b"}) == [0, 1]
    assert visible_gpu_indices(2, {}) == [0, 1]


def test_broken_nvml_is_dropped_after_failures_with_one_warning(tmp_path, caplog):
    store = LocalBlobStore(tmp_path / "s")
    prefix = series_prefix("monitor", "F", "1", "train", "2", 0, node=0)
    nv = fake_pynvml(broken=True)
    m = Monitor(store, prefix, interval=0.05, samplers=[ProcessTreeSampler(), NvmlSampler(nv)], chunk_s=60)
    with caplog.at_level(logging.WARNING, logger="stoker.monitor.monitor"):
        m.start()
        for _ in range(MAX_FAILURES + 3):
            m.sample_once()
        m.stop()
    warned = [r for r in caplog.records if "nvml sampler failed" in r.getMessage()]
    assert len(warned) == 1 and "every NVML query failed" in warned[0].getMessage()
    assert [s.name for s in m.samplers] == [] and nv.calls[-1] == "shutdown"
    recs = read_series(store, prefix)
    assert len(recs) >= MAX_FAILURES + 3 and all("gpus" not in r and r["cpu_percent"] is not None for r in recs)


# ---- psutil: a real process tree ----------------------------------------------------------------------------

BURN = "import time\nend = time.time() + 30\nwhile time.time() < end: pass\n"


def test_cpu_of_a_grandchild_burning_a_core():
    """The task's tree: this process -> a waiting child -> a grandchild that spins. Its CPU counts, and matches
    the CPU time the kernel charged to the tree over the same interval (this box may be shared, so the spinner
    may get less than a whole core: the check is against that truth, and above a floor)."""
    parent = subprocess.Popen([sys.executable, "-c",
                               f"import subprocess, sys; subprocess.run([sys.executable, '-c', {BURN!r}])"])
    try:
        deadline = time.time() + 20
        # the spinner is the child of *our* child (the session may have other children: Slurm daemons ...)
        while not psutil.Process(parent.pid).children() and time.time() < deadline:
            time.sleep(0.05)
        tree = [psutil.Process(), *psutil.Process().children(recursive=True)]

        def charged() -> float:
            return sum(sum(p.cpu_times()[:2]) for p in tree)

        s = ProcessTreeSampler()
        first: dict = {}
        s.sample(first)
        c0, t0 = charged(), time.monotonic()
        assert first["cpu_percent"] is None, "no interval yet"
        assert len(s.pids) >= 3
        time.sleep(2.5)
        rec: dict = {}
        s.sample(rec)
        truth = 100 * (charged() - c0) / (time.monotonic() - t0)
        assert truth > 15, f"the spinner hardly ran ({truth:.0f}%): the box is overloaded"
        # the sampler's interval and ours differ by the sampling calls themselves: close, not equal, on a busy box
        assert rec["cpu_percent"] == pytest.approx(truth, rel=0.3), (rec, truth)
        assert rec["rss_mb"] > 10 and 0 < rec["host_mem_used_mb"] <= rec["host_mem_total_mb"]
    finally:
        for c in psutil.Process(parent.pid).children(recursive=True):
            c.kill()
        parent.kill()
        parent.wait()


def _children_cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _own_cpu() -> float:
    return sum(psutil.Process().cpu_times()[:2])


SPIN = "import time\nend = time.process_time() + {s}\nwhile time.process_time() < end: pass\n"


def test_short_lived_child_is_counted_once_reaped_without_a_walk():
    s = ProcessTreeSampler(min_refresh_s=3600)
    s.sample({})
    k0, o0 = _children_cpu(), _own_cpu()
    subprocess.run([sys.executable, "-c", SPIN.format(s=0.4)], check=True)  # born, spun and reaped unseen
    s.sample({})
    truth = (_children_cpu() - k0) + (_own_cpu() - o0)
    assert s.walks == 1 and truth > 0.4
    assert s.cpu_seconds == pytest.approx(truth, rel=0.1, abs=0.03)


def test_tracked_child_that_exits_is_not_counted_twice():
    k0 = _children_cpu()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)\n" + SPIN.format(s=0.6)])
    time.sleep(0.1)
    s = ProcessTreeSampler(min_refresh_s=3600)
    s.sample({})
    o0, before = _own_cpu(), sum(psutil.Process(child.pid).cpu_times()[:2])  # the child's start-up: not counted
    assert child.pid in s.pids
    while child.poll() is None:
        time.sleep(0.1)
        s.sample({})
    s.sample({})  # after the reap: the child's whole time moved into our children time
    truth = (_children_cpu() - k0 - before) + (_own_cpu() - o0)
    assert child.pid not in s.pids and truth > 0.6
    assert s.cpu_seconds == pytest.approx(truth, rel=0.1, abs=0.05), "counted once, not twice"


def test_tree_walks_are_spaced_and_dead_processes_leave():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        s = ProcessTreeSampler(min_refresh_s=3600)
        s.sample({})
        assert child.pid in s.pids
        child.kill()
        child.wait()
        for _ in range(5):
            s.sample({})
        assert s.walks == 1, "no re-walk before min_refresh_s"
        assert child.pid not in s.pids, "a process that exited is dropped without a walk"
    finally:
        child.kill()
        child.wait()


# ---- Monitor into the store, decorators ----------------------------------------------------------------------

def test_monitor_writes_samples_while_running_and_on_stop(tmp_path):
    store = LocalBlobStore(tmp_path / "s")
    prefix = series_prefix("monitor", "F", "1", "train", "2", 0, node=1)
    m = Monitor(store, prefix, interval=0.05, node=1, samplers=[ProcessTreeSampler()], chunk_s=0.2).start()
    deadline = time.time() + 10
    while not read_series(store, prefix) and time.time() < deadline:
        time.sleep(0.05)
    assert read_series(store, prefix), "a chunk lands while sampling"
    time.sleep(0.3)
    m.stop()
    m.stop()
    recs = read_series(store, prefix)
    assert len(recs) >= 5 and all(r["node"] == 1 and r["cpu_percent"] is not None for r in recs)
    assert recs == sorted(recs, key=lambda r: r["time"])
    assert chunk_seconds(1) == 15 and chunk_seconds(0.2) == 10 and chunk_seconds(10) == 30


def test_decorators_validate_and_parse_from_with():
    from stoker import monitor, neuron_monitor

    @neuron_monitor(interval=2)
    def f(self):
        pass

    d = f._pending_decorators[0]
    assert d.name == "neuron_monitor" and d.attributes == {"interval": 2.0, "gpu": None, "neuron": True}
    assert parse_with("monitor:interval=0.5,gpu=false").attributes == {"interval": 0.5, "gpu": False,
                                                                         "neuron": None}
    with pytest.raises(ConfigError, match="interval=0.0.*at least 0.05"):
        monitor(interval=0)(f)
    with pytest.raises(ConfigError, match="gpu='yes'"):
        monitor(gpu="yes")(f)
