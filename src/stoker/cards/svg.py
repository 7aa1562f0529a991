"""Charts as inline SVG, drawn in Python: no script, no network, so a card or a report opens offline anywhere.

`line_chart` and `bar_chart` draw series; `vega_to_svg` draws the simple Vega-Lite specs (one view or layers of
line / bar / point / area marks over inline `data.values`, an optional color field splitting series). A spec
it cannot draw gives None, and the caller shows the spec's data instead.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2", "#ff9da6",
           "#9d755d", "#bab0ac")
MAX_POINTS = 600  # a series longer than this is thinned (min/max kept per bucket) before drawing


def _esc(s: Any) -> str:
    return html.escape(str(s), quote=True)


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e6 or a < 1e-3:
        return f"{v:.2g}"
    if a >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}"


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, n)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step) * step
    out, v = [], start
    while v <= hi + step * 1e-9 and len(out) < 20:
        out.append(round(v, 12))
        v += step
    return out


def thin(points: Sequence[tuple[float, float]], limit: int = MAX_POINTS) -> list[tuple[float, float]]:
    """At most about `limit` points: per bucket, the min and the max are kept (peaks stay visible)."""
    pts = list(points)
    if len(pts) <= limit:
        return pts
    size = math.ceil(len(pts) / (limit // 2))
    out: list[tuple[float, float]] = []
    for i in range(0, len(pts), size):
        bucket = pts[i:i + size]
        lo, hi = min(bucket, key=lambda p: p[1]), max(bucket, key=lambda p: p[1])
        out.extend(sorted({lo, hi}, key=lambda p: p[0]))
    return out


def _numbers(points: Sequence[tuple[Any, Any]]) -> list[tuple[float, float]]:
    out = []
    for x, y in points:
        try:
            fx, fy = float(x), float(y)
        except (TypeError, ValueError):
            continue
        if math.isfinite(fx) and math.isfinite(fy):
            out.append((fx, fy))
    return out


def line_chart(series: dict[str, Sequence[tuple[Any, Any]]], *, title: str = "", x_label: str = "",
               y_label: str = "", width: int = 640, height: int = 220, mark: str = "line",
               y_min: float | None = None, y_max: float | None = None) -> str:
    """An SVG line (or point/area) chart of named series of (x, y) points; non-numeric points are skipped."""
    clean = {name: thin(sorted(_numbers(pts))) for name, pts in series.items()}
    clean = {k: v for k, v in clean.items() if v}
    left, right, top, bottom = 56, 12, 24 if title else 10, 34
    pw, ph = width - left - right, height - top - bottom
    parts = [f'<svg class="chart" role="img" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">']
    if title:
        parts.append(f'<title>{_esc(title)}</title><text x="{left}" y="15" font-weight="bold" '
                     f'font-size="12">{_esc(title)}</text>')
    if not clean:
        parts.append(f'<text x="{left + 10}" y="{top + ph / 2}" fill="#888">no data</text></svg>')
        return "".join(parts)
    xs = [p[0] for pts in clean.values() for p in pts]
    ys = [p[1] for pts in clean.values() for p in pts]
    x0, x1 = min(xs), max(xs)
    y0 = min(ys) if y_min is None else min(y_min, min(ys))  # a domain widens to fit the data, never clips it
    y1 = max(ys) if y_max is None else max(y_max, max(ys))
    if mark in ("area", "bar"):
        y0 = min(y0, 0.0)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y0, y1 = y0 - (abs(y0) or 1) * 0.1, y1 + (abs(y1) or 1) * 0.1

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + ph - (y - y0) / (y1 - y0) * ph

    parts.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fff" stroke="#ddd"/>')
    for t in _ticks(y0, y1):
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#eee"/>'
                     f'<text x="{left - 4}" y="{sy(t) + 4:.1f}" text-anchor="end" fill="#555">{_fmt(t)}</text>')
    for t in _ticks(x0, x1, 6):
        parts.append(f'<text x="{sx(t):.1f}" y="{top + ph + 14}" text-anchor="middle" fill="#555">{_fmt(t)}</text>')
    if x_label:
        parts.append(f'<text x="{left + pw / 2}" y="{height - 4}" text-anchor="middle" fill="#333">'
                     f'{_esc(x_label)}</text>')
    if y_label:
        parts.append(f'<text x="12" y="{top + ph / 2}" text-anchor="middle" fill="#333" '
                     f'transform="rotate(-90 12 {top + ph / 2})">{_esc(y_label)}</text>')
    for i, (name, pts) in enumerate(clean.items()):
        color = PALETTE[i % len(PALETTE)]
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        if mark == "point":
            parts.extend(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{color}"/>' for x, y in pts)
        elif mark == "area":
            base = sy(max(y0, 0.0) if y0 < 0 < y1 else y0)
            parts.append(f'<polygon points="{sx(pts[0][0]):.1f},{base:.1f} {coords} {sx(pts[-1][0]):.1f},'
                         f'{base:.1f}" fill="{color}" fill-opacity="0.35" stroke="{color}"/>')
        else:
            parts.append(f'<polyline class="series" data-points="{len(pts)}" points="{coords}" fill="none" '
                         f'stroke="{color}" stroke-width="1.5"><title>{_esc(name)}</title></polyline>')
    if len(clean) > 1 or (len(clean) == 1 and next(iter(clean)) not in ("", y_label)):
        for i, name in enumerate(clean):
            lx, ly = left + 8 + (i % 4) * (pw // 4), top + 10 + (i // 4) * 12
            parts.append(f'<rect x="{lx}" y="{ly - 7}" width="8" height="8" fill="{PALETTE[i % len(PALETTE)]}"/>'
                         f'<text x="{lx + 11}" y="{ly}" fill="#333">{_esc(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def bar_chart(bars: Sequence[tuple[Any, Any]], *, title: str = "", x_label: str = "", y_label: str = "",
              width: int = 640, height: int = 220) -> str:
    """An SVG bar chart of (category, value) pairs."""
    vals = []
    for cat, v in bars:
        try:
            fv = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(fv):
            vals.append((str(cat), fv))
    left, right, top, bottom = 56, 12, 24 if title else 10, 40
    pw, ph = width - left - right, height - top - bottom
    parts = [f'<svg class="chart" role="img" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">']
    if title:
        parts.append(f'<title>{_esc(title)}</title><text x="{left}" y="15" font-weight="bold" '
                     f'font-size="12">{_esc(title)}</text>')
    if not vals:
        parts.append(f'<text x="{left + 10}" y="{top + ph / 2}" fill="#888">no data</text></svg>')
        return "".join(parts)
    y0, y1 = min(0.0, min(v for _, v in vals)), max(0.0, max(v for _, v in vals))
    if y1 == y0:
        y1 = y0 + 1

    def sy(y: float) -> float:
        return top + ph - (y - y0) / (y1 - y0) * ph

    parts.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fff" stroke="#ddd"/>')
    for t in _ticks(y0, y1):
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#eee"/>'
                     f'<text x="{left - 4}" y="{sy(t) + 4:.1f}" text-anchor="end" fill="#555">{_fmt(t)}</text>')
    slot = pw / len(vals)
    for i, (cat, v) in enumerate(vals):
        x = left + i * slot + slot * 0.1
        ya, yb = sorted((sy(v), sy(0.0)))
        parts.append(f'<rect class="bar" x="{x:.1f}" y="{ya:.1f}" width="{slot * 0.8:.1f}" height="{yb - ya:.1f}" '
                     f'fill="{PALETTE[0]}"><title>{_esc(cat)}: {_fmt(v)}</title></rect>')
        if len(vals) <= 30:
            parts.append(f'<text x="{x + slot * 0.4:.1f}" y="{top + ph + 14}" text-anchor="middle" '
                         f'fill="#555">{_esc(cat[:12])}</text>')
    if x_label:
        parts.append(f'<text x="{left + pw / 2}" y="{height - 4}" text-anchor="middle" fill="#333">'
                     f'{_esc(x_label)}</text>')
    if y_label:
        parts.append(f'<text x="12" y="{top + ph / 2}" text-anchor="middle" fill="#333" '
                     f'transform="rotate(-90 12 {top + ph / 2})">{_esc(y_label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _mark_type(mark: Any) -> str | None:
    return mark.get("type") if isinstance(mark, dict) else mark if isinstance(mark, str) else None


def _field(enc: dict[str, Any], channel: str) -> tuple[str | None, str]:
    ch = enc.get(channel) or {}
    if not isinstance(ch, dict):
        return None, ""
    title = ch.get("title")
    if title is None and isinstance(ch.get("axis"), dict):
        title = ch["axis"].get("title")
    return ch.get("field"), str(title or ch.get("field") or "")


def vega_to_svg(spec: dict[str, Any], width: int = 640, height: int = 220) -> str | None:
    """Draw a simple Vega-Lite spec as SVG, or return None when it uses something this renderer does not draw."""
    if not isinstance(spec, dict):
        return None
    title = spec.get("title")
    title = title.get("text") if isinstance(title, dict) else title
    w = spec.get("width") if isinstance(spec.get("width"), int) else width
    h = spec.get("height") if isinstance(spec.get("height"), int) else height
    views = spec.get("layer") if isinstance(spec.get("layer"), list) else [spec]
    top_values = (spec.get("data") or {}).get("values") if isinstance(spec.get("data"), dict) else None
    series: dict[str, list[tuple[Any, Any]]] = {}
    marks: set[str] = set()
    x_title = y_title = ""
    y_domain: list[float] | None = None
    for view in views:
        if not isinstance(view, dict):
            return None
        mark = _mark_type(view.get("mark"))
        data = view.get("data") if isinstance(view.get("data"), dict) else None
        values = data.get("values") if data else top_values
        enc = view.get("encoding") or spec.get("encoding") or {}
        if mark not in ("line", "bar", "point", "area", "circle") or not isinstance(values, list) or view.get(
                "transform") or spec.get("transform"):
            return None
        xf, xt = _field(enc, "x")
        yf, yt = _field(enc, "y")
        cf, _ = _field(enc, "color")
        if not xf or not yf:
            return None
        x_title, y_title = x_title or xt, y_title or yt
        dom = ((enc.get("y") or {}).get("scale") or {}).get("domain") if isinstance(enc.get("y"), dict) else None
        if isinstance(dom, list) and len(dom) == 2 and all(isinstance(v, (int, float)) for v in dom):
            y_domain = [float(dom[0]), float(dom[1])]
        marks.add("point" if mark == "circle" else mark)
        for row in values:
            if not isinstance(row, dict):
                continue
            name = str(row.get(cf)) if cf else (yt if len(views) == 1 else f"{yt}")
            series.setdefault(name, []).append((row.get(xf), row.get(yf)))
    if len(marks) != 1:
        marks = {"line"} if marks else marks
    if not marks:
        return None
    mark = marks.pop()
    if mark == "bar":
        if len(series) != 1:
            return None
        return bar_chart(next(iter(series.values())), title=str(title or ""), x_label=x_title, y_label=y_title,
                         width=w, height=h)
    numeric = all(_numbers(pts) for pts in series.values())
    if not numeric:
        return None
    return line_chart(series, title=str(title or ""), x_label=x_title, y_label=y_title, width=w, height=h,
                      mark=mark, y_min=y_domain[0] if y_domain else None, y_max=y_domain[1] if y_domain else None)
