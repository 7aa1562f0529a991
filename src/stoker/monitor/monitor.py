"""`Monitor`: samples the task's node every `interval` seconds in a side thread and appends the records to a
series in the store (one per node), written as a chunk every 10-30 s and at `stop()`.

It never fails the task: a missing tool gives one warning line and the samples go on without it; a sampler that
raises is reported once and dropped after a few failures in a row; a store that refuses a chunk is retried with
the next one (SeriesWriter).

    m = Monitor(store, series_prefix("monitor", flow, run, step, task, attempt, node=0), interval=1).start()
    ...
    m.stop()
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from typing import Any

from stoker.monitor.samplers import NeuronMonitorSampler, NvmlSampler, ProcessTreeSampler, find_neuron_monitor
from stoker.store.blobs import BlobStore
from stoker.store.series import SeriesWriter

log = logging.getLogger(__name__)

MAX_FAILURES = 5  # a sampler that fails this many samples in a row is dropped


def neuron_devices_present(dev_dir: str = "/dev") -> bool:
    try:
        return any(re.fullmatch(r"neuron\d+", n) for n in os.listdir(dev_dir))
    except OSError:
        return False


def build_samplers(interval: float, *, gpu: bool | None = None, neuron: bool | None = None, pid: int | None = None,
                   nvml: Any = None, warn: Any = log.warning) -> list[Any]:
    """The samplers for this node. `gpu` / `neuron`: True wants it (a warning when it cannot start), None uses it
    when the node has such devices (a warning only when devices are there but the tool is not), False skips it."""
    samplers: list[Any] = []
    tree = None
    try:
        tree = ProcessTreeSampler(pid)
        samplers.append(tree)
    except Exception as exc:  # noqa: BLE001
        warn(f"@monitor: process sampling is off ({type(exc).__name__}: {exc})")
    if gpu is not False:
        try:
            samplers.append(NvmlSampler(nvml))
        except Exception as exc:  # noqa: BLE001 - ImportError, NVMLError_LibraryNotFound, no GPU ...
            from stoker.monitor.host import local_gpu_count

            if gpu or local_gpu_count() > 0:
                hint = ("install nvidia-ml-py (pip install nvidia-ml-py)" if isinstance(exc, ImportError)
                        else f"NVML failed: {type(exc).__name__}: {exc}")
                warn(f"@monitor: GPU sampling is off: {hint}; sampling CPU and memory only")
    if neuron is not False:
        exe = find_neuron_monitor()
        present = neuron_devices_present()
        if exe and (neuron or present):
            try:
                nm = NeuronMonitorSampler(interval, exe, pids=(lambda: tree.pids) if tree else None)
                samplers.append(nm)
                if tree:
                    tree.exclude.add(nm.proc.pid)
            except Exception as exc:  # noqa: BLE001
                warn(f"@monitor: NeuronCore sampling is off: {exe} did not start ({type(exc).__name__}: {exc}); "
                     f"sampling CPU and memory only")
        elif not exe and (neuron or present):
            warn("@monitor: NeuronCore sampling is off: neuron-monitor was not found on PATH or in "
                 "/opt/aws/neuron/bin (install aws-neuronx-tools, or set STOKER_NEURON_MONITOR to its path); "
                 "sampling CPU and memory only")
    return samplers


def chunk_seconds(interval: float) -> float:
    """How often a chunk is written: ~15 samples, kept within 10-30 s (fewer objects, and still live)."""
    return min(30.0, max(10.0, 15 * interval))


class Monitor:
    """Samples every `interval` s in a daemon thread into the series at `prefix`. `samplers=None` builds them
    from `gpu` / `neuron` (see build_samplers); tests and benchmarks may pass their own."""

    def __init__(self, store: BlobStore, prefix: str, *, interval: float = 1.0, node: int = 0,
                 samplers: list[Any] | None = None, gpu: bool | None = None, neuron: bool | None = None,
                 pid: int | None = None, chunk_s: float | None = None) -> None:
        self.interval = float(interval)
        self.node = int(node)
        self.store, self.prefix = store, prefix
        self.samplers = samplers if samplers is not None else build_samplers(
            self.interval, gpu=gpu, neuron=neuron, pid=pid)
        self.failures: dict[str, int] = {}
        self.warned: set[str] = set()
        self.samples = 0
        self.writer: SeriesWriter | None = None
        self.chunk_s = chunk_s if chunk_s is not None else chunk_seconds(self.interval)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="stoker monitor")

    def start(self) -> Monitor:
        self.writer = SeriesWriter(self.store, self.prefix, interval=self.chunk_s)
        self._collect()  # primes CPU counters; that first record has cpu_percent None and is not kept
        self._thread.start()
        return self

    def _collect(self) -> dict[str, Any]:
        record: dict[str, Any] = {"time": round(time.time(), 2), "node": self.node}
        for s in list(self.samplers):
            try:
                s.sample(record)
                self.failures[s.name] = 0
            except Exception as exc:  # noqa: BLE001 - a sampler must never fail the task
                n = self.failures[s.name] = self.failures.get(s.name, 0) + 1
                if s.name not in self.warned:
                    self.warned.add(s.name)
                    log.warning(f"@monitor: the {s.name} sampler failed ({type(exc).__name__}: {exc}); "
                                f"its samples are skipped")
                if n >= MAX_FAILURES:
                    self.samplers.remove(s)
                    _close(s)
        return record

    def sample_once(self) -> dict[str, Any]:
        """Take one sample and append it to the series."""
        record = self._collect()
        if self.writer is not None:
            self.writer.add(record)
        self.samples += 1
        return record

    def _loop(self) -> None:
        due = time.monotonic() + self.interval
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            try:
                self.sample_once()
            except Exception:  # noqa: BLE001 - the loop itself must not die either
                log.debug("monitor sample failed", exc_info=True)
            due += self.interval
            now = time.monotonic()
            if due < now:  # fell behind (a suspended process): skip the missed ticks instead of bursting
                due = now + self.interval

    def stop(self) -> None:
        """Stop sampling and write what is left. Safe to call twice; never raises."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval + 5)
        samplers, self.samplers = self.samplers, []
        for s in samplers:
            _close(s)
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception:  # noqa: BLE001
                log.debug("monitor flush failed", exc_info=True)
            self.writer = None


def _close(sampler: Any) -> None:
    try:
        sampler.close()
    except Exception:  # noqa: BLE001
        log.debug("closing %s failed", getattr(sampler, "name", sampler), exc_info=True)
