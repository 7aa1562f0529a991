/* stoker's vendored chart library: SVG line charts, several series, x = step or time, values on hover.
   No dependencies, no network. StokerChart.line(container, {title, series: [{name, points: [[x, y], ...]}],
   xLabel, xTime}) draws into container and sets container.dataset.points (the number of points drawn). */
(function (global) {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
  var W = 460, H = 220, M = {l: 58, r: 12, t: 26, b: 34};

  function el(name, attrs, parent) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }

  function ticks(lo, hi, n, integer) {
    if (!(hi > lo)) { hi = lo + 1; lo = lo - 1; }
    var raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw))), f = raw / mag;
    var step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag, out = [];
    if (integer) step = Math.max(1, Math.round(step));
    for (var v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(v);
    return out;
  }

  function fmt(v) {
    if (v === null || v === undefined || isNaN(v)) return "-";
    var a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(2);
    return String(Math.round(v * 1000) / 1000);
  }

  function fmtX(v, xTime) {
    if (!xTime) return fmt(v);
    var s = Math.round(v);
    return s < 120 ? s + "s" : s < 7200 ? (s / 60).toFixed(1) + "m" : (s / 3600).toFixed(1) + "h";
  }

  function nearest(points, x) {  // points sorted by x: index of the one closest to x
    var lo = 0, hi = points.length - 1;
    while (hi - lo > 1) { var mid = (lo + hi) >> 1; if (points[mid][0] < x) lo = mid; else hi = mid; }
    return Math.abs(points[lo][0] - x) <= Math.abs(points[hi][0] - x) ? lo : hi;
  }

  function line(container, opts) {
    var series = (opts.series || []).map(function (s) {
      var pts = s.points.filter(function (p) { return p[1] !== null && p[1] !== undefined && isFinite(p[1]); });
      pts.sort(function (a, b) { return a[0] - b[0]; });
      return {name: s.name, points: pts};
    }).filter(function (s) { return s.points.length; });
    container.innerHTML = "";
    container.classList.add("chart");
    var total = series.reduce(function (n, s) { return n + s.points.length; }, 0);
    container.dataset.points = String(total);
    container.dataset.series = String(series.length);
    var svg = el("svg", {viewBox: "0 0 " + W + " " + H, width: W, height: H, role: "img"}, container);
    el("text", {x: M.l, y: 16, "class": "chart-title"}, svg).textContent = opts.title || "";
    if (!total) {
      el("text", {x: W / 2, y: H / 2, "class": "chart-empty", "text-anchor": "middle"}, svg).textContent = "no data yet";
      return;
    }
    var xs = [], ys = [];
    series.forEach(function (s) { s.points.forEach(function (p) { xs.push(p[0]); ys.push(p[1]); }); });
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys);
    if (x1 === x0) { x1 = x0 + 1; }
    if (y1 === y0) { y1 = y0 + Math.max(Math.abs(y0) * 0.1, 1); y0 = y0 - Math.max(Math.abs(y0) * 0.1, 1); }
    var pw = W - M.l - M.r, ph = H - M.t - M.b;
    function sx(v) { return M.l + (v - x0) / (x1 - x0) * pw; }
    function sy(v) { return M.t + ph - (v - y0) / (y1 - y0) * ph; }
    ticks(y0, y1, 4).forEach(function (t) {
      el("line", {x1: M.l, x2: W - M.r, y1: sy(t), y2: sy(t), "class": "grid-line"}, svg);
      el("text", {x: M.l - 6, y: sy(t) + 4, "text-anchor": "end", "class": "tick"}, svg).textContent = fmt(t);
    });
    ticks(x0, x1, 5, !opts.xTime).forEach(function (t) {
      el("text", {x: sx(t), y: H - M.b + 16, "text-anchor": "middle", "class": "tick"}, svg).textContent = fmtX(t, opts.xTime);
    });
    el("text", {x: W - M.r, y: H - 4, "text-anchor": "end", "class": "axis-label"}, svg).textContent = opts.xLabel || "";
    series.forEach(function (s, i) {
      var color = COLORS[i % COLORS.length];
      el("polyline", {points: s.points.map(function (p) { return sx(p[0]).toFixed(1) + "," + sy(p[1]).toFixed(1); }).join(" "),
                      fill: "none", stroke: color, "stroke-width": 1.6, "class": "series", "data-name": s.name,
                      "data-points": s.points.length}, svg);
      if (s.points.length === 1) el("circle", {cx: sx(s.points[0][0]), cy: sy(s.points[0][1]), r: 3, fill: color}, svg);
    });
    var legend = document.createElement("div");
    legend.className = "legend";
    series.forEach(function (s, i) {
      var item = document.createElement("span");
      item.innerHTML = '<i style="background:' + COLORS[i % COLORS.length] + '"></i>';
      item.appendChild(document.createTextNode(s.name));
      legend.appendChild(item);
    });
    container.appendChild(legend);
    var cursor = el("line", {y1: M.t, y2: M.t + ph, "class": "cursor", visibility: "hidden"}, svg);
    var tip = document.createElement("div");
    tip.className = "chart-tip";
    tip.hidden = true;
    container.appendChild(tip);
    svg.addEventListener("mousemove", function (ev) {
      var box = svg.getBoundingClientRect(), x = x0 + ((ev.clientX - box.left) * W / box.width - M.l) / pw * (x1 - x0);
      var lines = [(opts.xLabel || "x") + " " + fmtX(x, opts.xTime)], cx = null;
      series.forEach(function (s) {
        var p = s.points[nearest(s.points, x)];
        if (cx === null) cx = sx(p[0]);
        lines.push(s.name + ": " + fmt(p[1]) + " @ " + fmtX(p[0], opts.xTime));
      });
      cursor.setAttribute("x1", cx); cursor.setAttribute("x2", cx); cursor.setAttribute("visibility", "visible");
      tip.textContent = lines.join("\n");
      tip.hidden = false;
    });
    svg.addEventListener("mouseleave", function () { cursor.setAttribute("visibility", "hidden"); tip.hidden = true; });
  }

  global.StokerChart = {line: line, format: fmt};
})(window);
