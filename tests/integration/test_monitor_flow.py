"""@monitor / @neuron_monitor in real runs (`python flow.py run`), samples read back from the run's store.

No GPU and no Neuron tools exist here, so two stand-ins are used and only where noted: the neuron-monitor
executable is tests/data/neuron_monitor/fake_neuron_monitor.py (prints recorded lines of the documented format),
and a broken `pynvml` module (init works, every query fails) is put on PYTHONPATH to break the NVML sampler.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from stoker import Flow
from stoker.store.blobs import open_store
from stoker.store.series import read_series, series_prefix
from tests.helpers import ROOT, run_flow

FAKE_NM = ROOT / "tests" / "data" / "neuron_monitor" / "fake_neuron_monitor.py"

BROKEN_PYNVML = '''"""Stand-in for nvidia-ml-py in a test: init works, every device query fails (a broken driver)."""
NVML_TEMPERATURE_GPU = 0


class NVMLError(Exception):
    pass


def nvmlInit():
    pass


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return 1


def nvmlDeviceGetHandleByIndex(i):
    return i


def _fail(*args):
    raise NVMLError("Unknown Error")


nvmlDeviceGetUtilizationRates = nvmlDeviceGetMemoryInfo = nvmlDeviceGetPowerUsage = _fail
nvmlDeviceGetTemperature = _fail
'''


@pytest.fixture(autouse=True)
def _no_gpu_env(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("FAKE_NEURON_MONITOR_MODE", raising=False)


def _fake_neuron_monitor(tmp_path: Path) -> str:
    exe = tmp_path / "bin" / "neuron-monitor"
    exe.parent.mkdir()
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE_NM} \"$@\"\n")
    exe.chmod(0o755)
    return str(exe)


def _samples(run, step: str) -> list[dict]:
    task = run[step].task
    return read_series(open_store(), series_prefix("monitor", "MonitorFlow", run.id, step, task.id,
                                                   task.retry_count, node=0))


def _lines(text: str, needle: str) -> list[str]:
    return [line for line in text.splitlines() if needle in line]


def test_monitor_samples_cpu_and_missing_neuron_monitor_warns_once(tmp_path):
    run_flow("monitor_flow.py", "run", cwd=tmp_path, env={"STOKER_NEURON_MONITOR": str(tmp_path / "absent")})
    run = Flow("MonitorFlow").latest_run
    assert run.successful
    work = _samples(run, "work")
    assert len(work) >= 5, work
    assert all(r["node"] == 0 and r["cpu_percent"] is not None and r["rss_mb"] > 0 for r in work)
    assert max(r["cpu_percent"] for r in work) > 25, "the child burning a core is in the task's tree"
    assert work == sorted(work, key=lambda r: r["time"])
    assert not _lines(run["work"].task.stderr, "@monitor"), "a CPU node with @monitor: nothing to warn about"
    neuron = _samples(run, "neuron")
    assert len(neuron) >= 5 and all("neuron" not in r and r["cpu_percent"] is not None for r in neuron)
    warned = _lines(run["neuron"].task.stderr, "neuron-monitor was not found")
    assert len(warned) == 1 and "aws-neuronx-tools" in warned[0]
    assert not _samples(run, "start"), "no decorator, no series"


def test_neuron_monitor_stream_lands_in_the_store(tmp_path):
    run_flow("monitor_flow.py", "run", cwd=tmp_path, env={"STOKER_NEURON_MONITOR": _fake_neuron_monitor(tmp_path)})
    run = Flow("MonitorFlow").latest_run
    with_neuron = [r for r in _samples(run, "neuron") if "neuron" in r]
    assert with_neuron, _samples(run, "neuron")
    n = with_neuron[0]["neuron"]
    assert [c["index"] for c in n["cores"]] == [0, 1, 2, 3] and n["cores"][1]["util"] == 91.5
    assert n["device_mem_used_mb"] > 0 and n["vcpu_util"] == 60.1
    assert max(r["cpu_percent"] for r in _samples(run, "neuron")) < 50, "neuron-monitor itself is not the task's"
    assert not _lines(run["neuron"].task.stderr, "@monitor")


def test_broken_samplers_do_not_fail_the_task(tmp_path):
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "pynvml.py").write_text(BROKEN_PYNVML)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(mods), os.environ.get("PYTHONPATH")])),
           "STOKER_NEURON_MONITOR": _fake_neuron_monitor(tmp_path), "FAKE_NEURON_MONITOR_MODE": "garbage"}
    run_flow("monitor_flow.py", "run", cwd=tmp_path, env=env)
    run = Flow("MonitorFlow").latest_run
    assert run.successful and run["work"].task.data.done
    for step in ("work", "neuron"):
        recs = _samples(run, step)
        assert len(recs) >= 5 and all(r["cpu_percent"] is not None and "gpus" not in r for r in recs)
        assert len(_lines(run[step].task.stderr, "the nvml sampler failed")) == 1
    died = _lines(run["neuron"].task.stderr, "the neuron sampler failed")
    assert len(died) == 1 and "exited with code 2" in died[0]


def test_each_gang_node_samples_into_its_own_series(tmp_path):
    run_flow("monitor_gang_flow.py", "run", cwd=tmp_path)
    run = Flow("MonitorGangFlow").latest_run
    assert run["join"].task.data.nodes == [0, 1]
    seen = set()
    for task in run["work"]:
        node = task.data.node
        recs = read_series(open_store(), series_prefix("monitor", "MonitorGangFlow", run.id, "work", task.id,
                                                       task.retry_count, node=node))
        assert len(recs) >= 3 and {r["node"] for r in recs} == {node}
        seen.add(node)
    assert seen == {0, 1}
