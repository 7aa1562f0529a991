"""The "monitor" card of @monitor / @neuron_monitor: a table of peaks and line charts per node, device and core.

It is built from the task's monitor series in the store (`.../monitor/<step>/<task>/<attempt>/<node>/`, one per
gang node), like Metaflow's @neuron_monitor card: peak utilisation first, then CPU and memory of the task's
process tree, each GPU's utilisation and memory, each NeuronCore's utilisation and the Neuron device memory.
Charts are VegaChart specs with inline data (thinned to a few hundred points), drawn as inline SVG.
"""

from __future__ import annotations

import time
from typing import Any

from stoker.cards.render import render_card_html
from stoker.cards.store import cards_prefix, write_card
from stoker.cards.svg import thin
from stoker.store.blobs import BlobStore
from stoker.store.series import read_series, series_prefix

CARD_ID = "monitor"


def monitor_nodes(store: BlobStore, flow: str, run_id: str, step: str, task_id: str, attempt: int) -> list[int]:
    """The gang nodes that wrote monitor samples for this task attempt."""
    base = series_prefix("monitor", flow, run_id, step, task_id, attempt)
    nodes = {n[len(base):].split("/", 1)[0] for n in store.list(base)}
    return sorted(int(n) for n in nodes if n.isdigit())


def latest_monitor_attempt(store: BlobStore, flow: str, run_id: str, step: str, task_id: str) -> int | None:
    base = f"runs/{flow}/{run_id}/monitor/{step}/{task_id}/"
    attempts = {n[len(base):].split("/", 1)[0] for n in store.list(base)}
    nums = [int(a) for a in attempts if a.isdigit()]
    return max(nums) if nums else None


def _line(title: str, rows: list[dict[str, Any]], y_title: str, series_field: str | None = None,
          width: int = 640, height: int = 200) -> dict[str, Any]:
    enc: dict[str, Any] = {"x": {"field": "t", "type": "quantitative", "title": "seconds"},
                           "y": {"field": "v", "type": "quantitative", "title": y_title}}
    if y_title == "%":  # utilisation and memory shares: always the whole 0-100 range
        enc["y"]["scale"] = {"domain": [0, 100]}
    if series_field:
        enc["color"] = {"field": series_field, "type": "nominal"}
    return {"type": "vega", "spec": {"title": title,
                                     "width": width, "height": height, "mark": "line",
                                     "data": {"values": rows}, "encoding": enc}}


def _rows(points: list[tuple[float, float]], **tags: Any) -> list[dict[str, Any]]:
    return [{"t": round(t, 2), "v": round(v, 3), **tags} for t, v in thin(points)]


def _peak(values: list[float]) -> float | None:
    return max(values) if values else None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def monitor_components(samples_by_node: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The monitor card's components (JSON dicts) from each node's samples."""
    comps: list[dict[str, Any]] = []
    peaks: list[list[Any]] = []
    charts: list[dict[str, Any]] = []
    total = sum(len(s) for s in samples_by_node.values())
    for node, samples in sorted(samples_by_node.items()):
        if not samples:
            continue
        t0 = min(_num(s.get("time")) or 0.0 for s in samples)

        def series(get: Any, samples: list[dict[str, Any]] = samples, t0: float = t0) -> list[tuple[float, float]]:
            out = []
            for s in samples:
                t, v = _num(s.get("time")), _num(get(s))
                if t is not None and v is not None:
                    out.append((t - t0, v))
            return out

        cpu = series(lambda s: s.get("cpu_percent"))
        rss = series(lambda s: s.get("rss_mb"))
        host = series(lambda s: s.get("host_mem_used_mb"))
        host_total = _peak([v for _, v in series(lambda s: s.get("host_mem_total_mb"))])
        span = max((t for t, _ in cpu), default=0.0)
        peaks.append([node, "CPU (process tree)", _fmt(_peak([v for _, v in cpu]), "%"),
                      _fmt(_peak([v for _, v in rss]), " MB RSS"), len(samples)])
        if host:
            peaks.append([node, "host memory", "-", _fmt(_peak([v for _, v in host]), " MB") +
                          (f" of {host_total:.0f} MB" if host_total else ""), len(host)])
        charts.append({"type": "markdown", "text": f"### Node {node} ({len(samples)} samples over {span:.0f} s)"})
        charts.append(_line(f"node {node}: CPU % of the task's processes (100 = one core)", _rows(cpu), "CPU %"))
        mem_rows = _rows(rss, series="task RSS") + _rows(host, series="host used")
        charts.append(_line(f"node {node}: memory (MB)", mem_rows, "MB", "series"))
        gpu_ids = sorted({g.get("index") for s in samples for g in (s.get("gpus") or []) if isinstance(g, dict)},
                         key=lambda i: (i is None, i))
        for gi in gpu_ids:
            def g_of(s: dict[str, Any], gi: Any = gi) -> dict[str, Any]:
                return next((g for g in s.get("gpus") or [] if isinstance(g, dict) and g.get("index") == gi), {})

            util = series(lambda s: g_of(s).get("util"))
            mem = series(lambda s: g_of(s).get("mem_used_mb"))
            mem_total = _peak([v for _, v in series(lambda s: g_of(s).get("mem_total_mb"))])
            peaks.append([node, f"GPU {gi}", _fmt(_peak([v for _, v in util]), "%"),
                          _fmt(_peak([v for _, v in mem]), " MB") + (f" of {mem_total:.0f} MB" if mem_total else ""),
                          len(util)])
            mem_pct = [(t, 100.0 * v / mem_total) for t, v in mem] if mem_total else []
            rows = _rows(util, series="utilisation %") + _rows(mem_pct, series="memory %")
            charts.append(_line(f"node {node}: GPU {gi} utilisation and memory", rows, "%", "series"))
        cores = sorted({c.get("index") for s in samples for c in ((s.get("neuron") or {}).get("cores") or [])
                        if isinstance(c, dict)}, key=lambda i: (i is None, i))
        for ci in cores:
            def c_of(s: dict[str, Any], ci: Any = ci) -> dict[str, Any]:
                cs = (s.get("neuron") or {}).get("cores") or []
                return next((c for c in cs if isinstance(c, dict) and c.get("index") == ci), {})

            util = series(lambda s: c_of(s).get("util"))
            peaks.append([node, f"NeuronCore {ci}", _fmt(_peak([v for _, v in util]), "%"), "-", len(util)])
            charts.append(_line(f"node {node}: NeuronCore {ci} utilisation", _rows(util), "%", width=420,
                                height=150))
        if cores or any(s.get("neuron") for s in samples):
            dev = series(lambda s: (s.get("neuron") or {}).get("device_mem_used_mb"))
            nhost = series(lambda s: (s.get("neuron") or {}).get("host_mem_used_mb"))
            vcpu = series(lambda s: (s.get("neuron") or {}).get("vcpu_util"))
            peaks.append([node, "Neuron device memory", "-", _fmt(_peak([v for _, v in dev]), " MB"), len(dev)])
            if vcpu:
                peaks.append([node, "vCPU (neuron-monitor)", _fmt(_peak([v for _, v in vcpu]), "%"), "-", len(vcpu)])
            rows = _rows(dev, series="device memory") + _rows(nhost, series="host memory (Neuron runtime)")
            charts.append(_line(f"node {node}: Neuron memory (MB)", rows, "MB", "series"))
    comps.append({"type": "markdown", "text": "# Monitor" + ("" if total else "\n\n_No samples yet._")})
    if peaks:
        comps.append({"type": "markdown", "text": "## Peak utilisation"})
        comps.append({"type": "table", "headers": ["node", "device", "peak utilisation", "peak memory", "samples"],
                      "data": peaks})
    return comps + charts


def _fmt(v: float | None, unit: str) -> str:
    return "-" if v is None else f"{v:.1f}{unit}"


def read_monitor_samples(store: BlobStore, flow: str, run_id: str, step: str, task_id: str,
                         attempt: int) -> dict[int, list[dict[str, Any]]]:
    return {n: read_series(store, series_prefix("monitor", flow, run_id, step, task_id, attempt, node=n))
            for n in monitor_nodes(store, flow, run_id, step, task_id, attempt)}


def monitor_card(store: BlobStore, flow: str, run_id: str, step: str, task_id: str, attempt: int,
                 final: bool = False) -> dict[str, Any]:
    """The monitor card's JSON, read from the store now."""
    samples = read_monitor_samples(store, flow, run_id, step, task_id, attempt)
    return {"id": CARD_ID, "type": "monitor", "title": f"Monitor: {step}/{task_id}", "updated": time.time(),
            "final": final, "pathspec": f"{flow}/{run_id}/{step}/{task_id}", "attempt": attempt,
            "components": monitor_components(samples)}


def write_monitor_card(store: BlobStore, flow: str, run_id: str, step: str, task_id: str, attempt: int,
                       final: bool = False) -> dict[str, Any]:
    """Build the monitor card from the series in the store and write it next to the task's other cards (the
    monitor can call this while the step runs for a live card; the task calls it once more at the end)."""
    card = monitor_card(store, flow, run_id, step, task_id, attempt, final=final)
    write_card(store, cards_prefix(flow, run_id, step, task_id, attempt), card, render_card_html(card))
    return card
