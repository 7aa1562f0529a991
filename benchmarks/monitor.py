"""@monitor's cost: CPU overhead of sampling a task's process tree, and the bytes its samples take in the store,
vs a plain psutil loop (what a user would otherwise write into a training script).

This process plays the task: it has a launcher child with 8 worker grandchildren (like torchrun and its
workers). Three phases of --seconds each at --interval (default 30 s at 1 s):
  baseline  the process idles                              -> its CPU time (what is there anyway)
  stoker    Monitor(interval) samples into a local store   -> CPU time over the baseline, and bytes written
  psutil    a thread doing, every interval, root.children(recursive=True), cpu_percent() and memory_info() of
            each, psutil.virtual_memory(), and appending one JSON line to a file
The CPU time is this process's (all threads: the sampler and the chunk writer included), so other load on the
machine does not inflate it. Bytes per week are measured bytes per sample x samples per week, for this CPU-only
node and for records with 8 GPUs and 32 NeuronCores (built by the same samplers from stand-in readings).

    python benchmarks/monitor.py                     # ~1.5 min
    python benchmarks/monitor.py --seconds 10        # quicker, noisier

Targets: stoker below 1% of one core at interval=1; a week of samples per node in tens of MB, not GBs.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

WEEK = 7 * 24 * 3600


def spawn_tree(workers: int) -> subprocess.Popen:
    code = ("import subprocess, sys\n"
            "ps = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)'])"
            f" for _ in range({workers})]\n"
            "[p.wait() for p in ps]\n")
    p = subprocess.Popen([sys.executable, "-c", code])
    import psutil

    deadline = time.time() + 30
    while len(psutil.Process(p.pid).children()) < workers and time.time() < deadline:
        time.sleep(0.05)
    return p


def cpu_over(seconds: float) -> float:
    c0 = time.process_time()
    time.sleep(seconds)
    return time.process_time() - c0


def run_stoker(seconds: float, interval: float, folder: Path) -> tuple[float, int, int, int]:
    from stoker.monitor.monitor import Monitor
    from stoker.store.blobs import LocalBlobStore
    from stoker.store.series import read_series, series_prefix

    store = LocalBlobStore(folder / "store")
    prefix = series_prefix("monitor", "Bench", "1", "train", "1", 0, node=0)
    c0 = time.process_time()
    m = Monitor(store, prefix, interval=interval).start()
    time.sleep(seconds)
    m.stop()
    cpu = time.process_time() - c0
    names = [n for n in store.list(prefix) if n.endswith((".jsonl", ".jsonl.gz"))]
    size = sum(len(store.read(n)) for n in names)
    return cpu, len(read_series(store, prefix)), size, len(names)


def run_plain_psutil(seconds: float, interval: float, folder: Path) -> tuple[float, int]:
    import psutil

    root = psutil.Process()
    stop = threading.Event()
    count = [0]

    def loop() -> None:
        with open(folder / "psutil.jsonl", "a") as f:
            while not stop.wait(interval):
                procs = [root, *root.children(recursive=True)]
                cpu = sum(p.cpu_percent() for p in procs)
                rss = sum(p.memory_info().rss for p in procs)
                vm = psutil.virtual_memory()
                f.write(json.dumps({"time": time.time(), "cpu_percent": cpu, "rss": rss, "mem_used": vm.used,
                                    "mem_total": vm.total}) + "\n")
                f.flush()
                count[0] += 1

    c0 = time.process_time()
    t = threading.Thread(target=loop, daemon=True)
    t.start()
    time.sleep(seconds)
    stop.set()
    t.join()
    return time.process_time() - c0, count[0]


def accelerator_record_sizes() -> dict[str, tuple[int, int]]:
    """Bytes of one stored record (as SeriesWriter writes it) with 8 GPUs, and with 32 NeuronCores."""
    from stoker.monitor.samplers import MiB, NvmlSampler, ProcessTreeSampler, parse_neuron_report

    base: dict = {"time": round(time.time(), 2), "node": 3}
    ProcessTreeSampler().sample(base)
    base["cpu_percent"] = 812.4  # a busy 8-worker node
    nv = SimpleNamespace(
        NVML_TEMPERATURE_GPU=0, nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 8,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=97 + h % 3),
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=(71234 + h) * MiB, total=81559 * MiB),
        nvmlDeviceGetPowerUsage=lambda h: 652_300 + h * 1000, nvmlDeviceGetTemperature=lambda h, s: 67 + h % 4)
    gpu = dict(base)
    NvmlSampler(nv).sample(gpu)
    doc = {"neuron_runtime_data": [{"pid": 100 + w, "error": "", "report": {
        "neuroncore_counters": {"neuroncores_in_use": {str(2 * w + k): {"neuroncore_utilization": 88.123 + k}
                                                       for k in range(2)}},
        "memory_used": {"neuron_runtime_used_bytes": {"host": 6997643264, "neuron_device": 12519788544}}}}
        for w in range(16)],
        "system_data": {"vcpu_usage": {"average_usage": {"idle": 39.36, "io_wait": 0.5}}},
        "neuron_hardware_info": {"neuron_device_count": 16, "neuron_device_memory_size": 34359738368}}
    trn = dict(base, neuron=parse_neuron_report(doc))

    def size(r: dict) -> tuple[int, int]:
        """(bytes as stored, bytes per sample if a 15-sample chunk were gzipped)"""
        line = json.dumps(r, separators=(",", ":")) + "\n"
        chunk = "".join(json.dumps(dict(r, time=r["time"] + i), separators=(",", ":")) + "\n" for i in range(15))
        return len(line), len(gzip.compress(chunk.encode())) // 15

    return {"cpu only (this node)": size(base), "8 GPUs (p5-like)": size(gpu),
            "32 NeuronCores (trn1.32xlarge)": size(trn)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--workers", type=int, default=8)
    a = ap.parse_args()
    import psutil

    from stoker.monitor.monitor import chunk_seconds

    tree = spawn_tree(a.workers)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            print(f"process tree: this process + launcher + {a.workers} workers; {len(psutil.pids())} processes on "
                  f"the host; {a.seconds:g} s per phase at interval {a.interval:g} s", flush=True)
            base = cpu_over(a.seconds)
            ours, samples, nbytes, chunks = run_stoker(a.seconds, a.interval, folder)
            plain, plain_samples = run_plain_psutil(a.seconds, a.interval, folder)
    finally:
        for c in psutil.Process(tree.pid).children(recursive=True):
            c.kill()
        tree.kill()
        tree.wait()

    ours_over, plain_over = max(0.0, ours - base), max(0.0, plain - base)
    pct = lambda cpu: 100 * cpu / a.seconds  # noqa: E731 - % of one core
    print("\nCPU time of this process over each phase (100% = one core)")
    print("| phase | CPU s | % of one core | ms per sample | samples |")
    print("|---|---|---|---|---|")
    print(f"| baseline (idle) | {base:.4f} | {pct(base):.3f}% | - | - |")
    print(f"| stoker Monitor | {ours:.4f} | {pct(ours_over):.3f}% over baseline | "
          f"{1000 * ours_over / max(samples, 1):.2f} | {samples} |")
    print(f"| plain psutil loop | {plain:.4f} | {pct(plain_over):.3f}% over baseline | "
          f"{1000 * plain_over / max(plain_samples, 1):.2f} | {plain_samples} |")
    ratio = plain_over / ours_over if ours_over > 0 else float("inf")
    verdict = "ok" if pct(ours_over) * a.interval < 1.0 else "MISS"
    print(f"\nstoker: {pct(ours_over):.3f}% of one core at interval {a.interval:g} s (target < 1%: {verdict}); "
          f"the plain psutil loop costs {ratio:.1f}x as much")

    per_week = WEEK / a.interval
    print(f"\nstore: {samples} samples in {chunks} chunks, {nbytes} bytes = {nbytes / max(samples, 1):.0f} bytes "
          f"per sample; a chunk every {chunk_seconds(a.interval):g} s = {WEEK / chunk_seconds(a.interval):,.0f} "
          f"objects per node-week")
    print("| record | bytes per sample (JSON) | per node-week (JSON) | per node-week as stored (gzip chunks) |")
    print("|---|---|---|---|")
    print(f"| measured, cpu only | - | - | {nbytes / max(samples, 1) * per_week / 1e6:.1f} MB "
          f"({nbytes / max(samples, 1):.0f} bytes a sample) |")
    for name, (size, gz) in accelerator_record_sizes().items():
        print(f"| {name} | {size} | {size * per_week / 1e6:.1f} MB | {gz * per_week / 1e6:.1f} MB |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
