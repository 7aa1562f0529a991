"""Samplers for @monitor: the task's process tree and the host (psutil), GPUs (NVML), NeuronCores (neuron-monitor).

Each sampler has a `name`, `sample(record)` that adds its keys to one record, and `close()`. They are built to be
cheap at one sample a second: psutil.Process objects are cached between samples, the process tree is re-walked
only every few seconds (a walk reads every /proc/*/stat of the host), and neuron-monitor runs as its own process
whose JSON lines a reader thread parses as they come. Numbers are rounded so that a week of samples stays small.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

MiB = 1024 * 1024


class ProcessTreeSampler:
    """CPU% (100 = one core) and summed RSS of a process and all its descendants (torchrun and its workers
    included), plus host memory.

    CPU is each tracked process's own CPU time between two samples, plus the CPU time of the children it reaped
    (the kernel's children_user/children_system): so a child too short-lived to be seen by a tree walk still
    counts, in the sample in which it was reaped. A tracked process's reaped time is not counted twice: when
    it leaves, what was already counted for it is taken back from its (tracked) reaper's jump."""

    name = "cpu"

    def __init__(self, pid: int | None = None, min_refresh_s: float = 1.0) -> None:
        import psutil

        self.psutil = psutil
        self.root = psutil.Process(pid or os.getpid())
        self.procs: dict[int, Any] = {self.root.pid: self.root}
        self.last: dict[int, tuple[float, float, int]] = {}  # pid -> (own CPU s, reaped children's CPU s, ppid)
        self.last_t: float | None = None
        self.min_refresh_s = min_refresh_s
        self.next_walk = 0.0
        self.walks = 0
        self.cpu_seconds = 0.0  # all CPU time counted so far (tests, benchmarks)
        self.exclude: set[int] = set()  # the monitor's own helpers (neuron-monitor): not the task's work
        self._proc_children = os.path.exists(f"/proc/{self.root.pid}/task/{self.root.pid}/children")

    @property
    def pids(self) -> set[int]:
        return set(self.procs)

    def _descendants(self) -> list[int]:
        if self._proc_children:  # O(tree): the kernel's per-thread children lists (CONFIG_PROC_CHILDREN)
            out, todo = [], [self.root.pid]
            while todo:
                pid = todo.pop()
                try:
                    tids = os.listdir(f"/proc/{pid}/task")
                except OSError:
                    continue
                for tid in tids:
                    try:
                        with open(f"/proc/{pid}/task/{tid}/children") as f:
                            kids = [int(c) for c in f.read().split()]
                    except OSError:
                        continue
                    out.extend(kids)
                    todo.extend(kids)
            return out
        return [p.pid for p in self.root.children(recursive=True)]  # O(host): reads every /proc/*/stat

    def _refresh(self, now: float) -> None:
        """Re-walk the tree. A walk's cost grows with the host's process count, so walks are spaced to keep
        them under ~0.5% of a core: at least `min_refresh_s` apart, and 200x their own duration."""
        t0 = time.thread_time()
        try:
            pids = self._descendants()
        except self.psutil.Error:
            pids = []
        for pid in pids:
            if pid not in self.procs and pid not in self.exclude:
                try:
                    self.procs[pid] = self.psutil.Process(pid)
                except self.psutil.Error:
                    continue
        self.walks += 1
        self.next_walk = now + max(self.min_refresh_s, 200 * (time.thread_time() - t0))

    def sample(self, record: dict[str, Any]) -> None:
        now = time.monotonic()
        if now >= self.next_walk:
            self._refresh(now)
        cpu, rss, dead = 0.0, 0, []
        dt = None if self.last_t is None else now - self.last_t
        wall = time.time()
        for pid, p in self.procs.items():
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    mem = p.memory_info().rss
                    # the parent, read once: psutil's ppid() re-checks pid reuse at every call (a second read)
                    ppid = self.last[pid][2] if pid in self.last else p.ppid()
            except self.psutil.Error:
                dead.append(pid)
                continue
            own = t.user + t.system
            kids = getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
            if pid in self.last:
                lo, lk, _ = self.last[pid]
                cpu += max(0.0, own - lo) + max(0.0, kids - lk)
            elif dt:  # found since the last sample: count the share of its life that fell in this interval
                try:
                    age = max(dt, wall - p.create_time())
                except self.psutil.Error:
                    age = dt
                cpu += (own + kids) * dt / age
            self.last[pid] = (own, kids, ppid)
            rss += mem
        for pid in dead:
            self.procs.pop(pid, None)
            lo, lk, ppid = self.last.pop(pid, (0.0, 0.0, 0))
            if ppid in self.procs and ppid not in dead:
                cpu -= lo + lk  # its tracked reaper's children time now holds all of it
        cpu = max(0.0, cpu)
        self.cpu_seconds += cpu
        self.last_t = now
        vm = self.psutil.virtual_memory()
        record["cpu_percent"] = round(100 * cpu / dt, 1) if dt else None
        record["rss_mb"] = round(rss / MiB)
        record["host_mem_used_mb"] = round((vm.total - vm.available) / MiB)
        record["host_mem_total_mb"] = round(vm.total / MiB)

    def close(self) -> None:
        pass


def visible_gpu_indices(count: int, env: dict[str, str] | None = None) -> list[int]:
    """NVML indices of the GPUs this task may use: CUDA_VISIBLE_DEVICES when it lists numbers, else all."""
    visible = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(range(count))
    parts = [p.strip() for p in visible.split(",") if p.strip()]
    if not all(p.lstrip("-").isdigit() for p in parts):  # UUIDs or MIG names: keep every device
        return list(range(count))
    out = []
    for p in parts:
        if int(p) < 0:
            break  # CUDA stops at the first invalid index
        if int(p) < count:
            out.append(int(p))
    return out


class NvmlSampler:
    """Per-GPU utilisation, memory, power and temperature through NVML (`nvidia-ml-py`, imported as pynvml).
    `nvml` is the module (tests pass a stand-in); a device query that fails leaves its field out."""

    name = "nvml"

    def __init__(self, nvml: Any = None) -> None:
        if nvml is None:
            import pynvml as nvml
        self.nvml = nvml
        nvml.nvmlInit()
        count = nvml.nvmlDeviceGetCount()
        self.handles = [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in visible_gpu_indices(count)]
        if not self.handles:
            nvml.nvmlShutdown()
            raise RuntimeError("NVML sees no GPU")

    def _query(self, h: Any) -> dict[str, Any]:
        n, out = self.nvml, {}
        try:
            out["util"] = int(n.nvmlDeviceGetUtilizationRates(h).gpu)
        except Exception:  # noqa: BLE001 - NVML raises NVMLError_NotSupported and friends per field
            pass
        try:
            m = n.nvmlDeviceGetMemoryInfo(h)
            out["mem_used_mb"], out["mem_total_mb"] = round(m.used / MiB), round(m.total / MiB)
        except Exception:  # noqa: BLE001
            pass
        try:
            out["power_w"] = round(n.nvmlDeviceGetPowerUsage(h) / 1000)  # milliwatts
        except Exception:  # noqa: BLE001
            pass
        try:
            out["temp_c"] = int(n.nvmlDeviceGetTemperature(h, getattr(n, "NVML_TEMPERATURE_GPU", 0)))
        except Exception:  # noqa: BLE001
            pass
        return out

    def sample(self, record: dict[str, Any]) -> None:
        gpus = []
        for i, h in self.handles:
            q = self._query(h)
            if q:
                gpus.append({"index": i, **q})
        if not gpus:
            raise RuntimeError("every NVML query failed")
        record["gpus"] = gpus

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


# ---- neuron-monitor -----------------------------------------------------------------------------------------

NEURON_MONITOR_PATHS = ("/opt/aws/neuron/bin/neuron-monitor",)


def find_neuron_monitor() -> str | None:
    """The neuron-monitor executable: $STOKER_NEURON_MONITOR, PATH, then the Neuron tools' install folder."""
    explicit = os.environ.get("STOKER_NEURON_MONITOR")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    found = shutil.which("neuron-monitor")
    if found:
        return found
    return next((p for p in NEURON_MONITOR_PATHS if os.access(p, os.X_OK)), None)


def neuron_monitor_config(interval: float) -> dict[str, Any]:
    """Only the metric groups the sampler reads: per-core utilisation, memory, vCPU; system vCPU and memory."""
    period = f"{max(1, round(interval))}s"  # NeuronCore counters are integrated over the period; 1 s is the floor
    return {
        "period": period,
        "neuron_runtimes": [{"tag_filter": ".*", "metrics": [
            {"type": "neuroncore_counters"}, {"type": "memory_used"}, {"type": "neuron_runtime_vcpu_usage"}]}],
        "system_metrics": [{"type": "vcpu_usage"}, {"type": "memory_info"}],
    }


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def parse_neuron_report(doc: dict[str, Any], pids: set[int] | None = None) -> dict[str, Any] | None:
    """One neuron-monitor JSON document -> the record's "neuron" entry, or None when it holds no Neuron data.

    Per-core utilisation comes from each application's `neuroncore_counters.neuroncores_in_use`, memory from
    `memory_used.neuron_runtime_used_bytes` (summed over applications), vCPU from `system_data.vcpu_usage`
    (100 - idle - io_wait, all vCPUs), else the applications' own `neuron_runtime_vcpu_usage`. With `pids`, only
    the applications in the task's process tree count, unless none of them is (another PID namespace)."""
    runtimes = [r for r in doc.get("neuron_runtime_data") or [] if isinstance(r, dict) and r.get("report")]
    if pids:
        mine = [r for r in runtimes if r.get("pid") in pids]
        runtimes = mine or runtimes
    cores: dict[int, float] = {}
    dev_mem = host_mem = 0.0
    have_mem = False
    rt_vcpu = None
    for r in runtimes:
        rep = r["report"]
        in_use = (rep.get("neuroncore_counters") or {}).get("neuroncores_in_use") or {}
        for key, data in in_use.items():
            try:
                idx = int(key)
            except (TypeError, ValueError):
                continue
            u = _num((data or {}).get("neuroncore_utilization"))
            if u is not None:
                cores[idx] = max(cores.get(idx, 0.0), u)
        used = (rep.get("memory_used") or {}).get("neuron_runtime_used_bytes") or {}
        if _num(used.get("neuron_device")) is not None or _num(used.get("host")) is not None:
            have_mem = True
            dev_mem += _num(used.get("neuron_device")) or 0.0
            host_mem += _num(used.get("host")) or 0.0
        v = (rep.get("neuron_runtime_vcpu_usage") or {}).get("vcpu_usage") or {}
        if _num(v.get("user")) is not None:
            rt_vcpu = (rt_vcpu or 0.0) + (_num(v.get("user")) or 0.0) + (_num(v.get("system")) or 0.0)
    avg = ((doc.get("system_data") or {}).get("vcpu_usage") or {}).get("average_usage") or {}
    vcpu = None
    if _num(avg.get("idle")) is not None:
        vcpu = 100.0 - (_num(avg.get("idle")) or 0.0) - (_num(avg.get("io_wait")) or 0.0)
    elif rt_vcpu is not None:
        vcpu = rt_vcpu
    if not cores and not have_mem and vcpu is None:
        return None
    out: dict[str, Any] = {"cores": [{"index": i, "util": round(cores[i], 1)} for i in sorted(cores)]}
    if have_mem:
        out["device_mem_used_mb"] = round(dev_mem / MiB)
        out["host_mem_used_mb"] = round(host_mem / MiB)
    if vcpu is not None:
        out["vcpu_util"] = round(max(0.0, vcpu), 1)
    hw = doc.get("neuron_hardware_info") or {}
    size, count = _num(hw.get("neuron_device_memory_size")), _num(hw.get("neuron_device_count"))
    if size and count:
        out["device_mem_total_mb"] = round(size * count / MiB)
    return out


class NeuronMonitorSampler:
    """Runs `neuron-monitor -c CONFIG` for the task's life; a reader thread parses each JSON line it prints and
    keeps the latest. `sample` adds that latest reading while it is fresh. neuron-monitor's own CPU is its own
    process's, not the task's."""

    name = "neuron"

    def __init__(self, interval: float, executable: str, pids: Callable[[], set[int]] | None = None) -> None:
        self.interval = interval
        self.pids = pids or (lambda: set())
        self.latest: tuple[float, dict[str, Any]] | None = None
        self.bad_lines = 0
        self.lines = 0
        cfg = neuron_monitor_config(interval)
        self.period = float(cfg["period"][:-1])
        fd, self.config_path = tempfile.mkstemp(prefix="stoker-neuron-monitor-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(cfg, f)
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([executable, "-c", self.config_path], stdout=subprocess.PIPE,
                                     stderr=self.stderr, stdin=subprocess.DEVNULL)
        self._reader = threading.Thread(target=self._read, daemon=True, name="neuron-monitor reader")
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines += 1
            try:
                doc = json.loads(raw)
                parsed = parse_neuron_report(doc, self.pids()) if isinstance(doc, dict) else None
            except Exception:  # noqa: BLE001 - a torn or foreign line is skipped
                self.bad_lines += 1
                continue
            if parsed is not None:
                self.latest = (time.monotonic(), parsed)

    def _stderr_tail(self) -> str:
        try:
            self.stderr.seek(0)
            return self.stderr.read()[-300:].decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""

    def sample(self, record: dict[str, Any]) -> None:
        code = self.proc.poll()
        latest = self.latest
        if code is not None and not self._reader.is_alive():
            raise RuntimeError(f"neuron-monitor exited with code {code}"
                               + (f": {self._stderr_tail()}" if self._stderr_tail() else ""))
        if latest and time.monotonic() - latest[0] <= max(3 * self.period, 5.0):
            record["neuron"] = latest[1]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=3)
        self._reader.join(timeout=3)
        if self.proc.stdout:
            self.proc.stdout.close()
        self.stderr.close()
        try:
            os.unlink(self.config_path)
        except OSError:
            pass
