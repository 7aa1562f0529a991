/* stoker ui: the goodput ledger (GET /api/runs/FLOW/RUN/goodput) as stacked horizontal bars: one for the run's
   node-time, one per attempt of every node of each training step (all attempts on one time scale), a legend with
   each category's seconds and share, and the goodput, ETTR, tokens/s and cost figures. Every segment carries
   data-category and data-seconds; every bar's track data-scale: the seconds its full width stands for. */
var StokerGoodput = (function () {
  "use strict";

  function esc(s) { return String(s === null || s === undefined ? "" : s).replace(/[&<>"']/g, function (c) {
    return {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]; }); }
  function secs(s) {
    if (s === null || s === undefined) return "-";
    var a = Math.abs(s);
    return a < 10 ? s.toFixed(2) + " s" : a < 120 ? s.toFixed(1) + " s" : a < 7200 ? (s / 60).toFixed(1) + " min" :
      (s / 3600).toFixed(1) + " h"; }
  function pct(x) { return x === null || x === undefined ? "-" : (100 * x).toFixed(1) + " %"; }
  function usd(x) { return "$" + x.toFixed(x < 1000 ? 2 : 0).replace(/\B(?=(\d{3})+(?!\d))/g, ","); }
  function count(n) { return String(Math.round(n)).replace(/\B(?=(\d{3})+(?!\d))/g, ","); }
  function plural(n, one, many) { return n + " " + (n === 1 ? one : many); }

  function positive(seconds) {  // what a bar draws: `other` may be negative (clocks of different hosts)
    var sum = 0; Object.keys(seconds).forEach(function (k) { if (seconds[k] > 0) sum += seconds[k]; }); return sum; }

  function breakdown(parts) {  // the start-up phases: "imports 6.7 s, launch 1.5 s"
    return Object.keys(parts || {}).filter(function (k) { return parts[k] > 0; }).map(function (k) {
      return k.replace(/_/g, " ") + " " + secs(parts[k]); }).join(", "); }

  // one stacked bar: its label, the track (width = `scale` seconds), its duration and a note
  function bar(key, label, seconds, wall, scale, cats, labels, startup, note, inside) {
    var segs = cats.filter(function (c) { return seconds[c] > 0; }).map(function (c) {
      var tip = labels[c] + ": " + secs(seconds[c]) + " (" + pct(wall > 0 ? seconds[c] / wall : null) + ")" +
        (c === "startup" && breakdown(startup) ? ": " + breakdown(startup) : "");
      var share = 100 * seconds[c] / scale, text = inside && share >= 6 ? pct(wall > 0 ? seconds[c] / wall : null) : "";
      return '<div class="gp-seg gp-' + c + '" data-category="' + c + '" data-seconds="' + seconds[c] +
        '" style="width:' + share + '%" title="' + esc(tip) + '">' + esc(text) + "</div>";
    });
    return '<div class="gp-row" data-bar="' + esc(key) + '"><span class="gp-label">' + label + '</span>' +
      '<div class="gp-track" data-scale="' + scale + '">' + segs.join("") + '</div><span class="gp-took">' +
      secs(wall) + '</span><span class="gp-note dim" title="' + esc(note || "") + '">' + esc(note || "") + "</span></div>";
  }

  function legend(total, cats, labels) {
    var wall = total.node_seconds;
    return '<div id="goodput-legend" class="gp-legend">' + cats.filter(function (c) {
      return Math.abs(total.seconds[c]) >= 0.0005 || c === "productive"; }).map(function (c) {
      return '<span data-category="' + c + '"><i class="gp-' + c + '"></i>' + esc(labels[c]) + " <b>" +
        secs(total.seconds[c]) + "</b> " + pct(wall > 0 ? total.seconds[c] / wall : null) + "</span>";
    }).join("") + "</div>";
  }

  function cost(c) {
    if (!c) return "";
    var prices = Object.keys(c.prices).map(function (k) { return k + " " + usd(c.prices[k]) + "/h"; }).join(", ");
    return '<p id="goodput-cost">lost work cost about <b>' + usd(c.lost_usd) + "</b>, all non-productive time about <b>" +
      usd(c.not_productive_usd) + "</b> of " + usd(c.paid_usd) + " paid (on-demand prices: " + esc(prices) + ")" +
      (c.unpriced_s > 0 ? "; " + secs(c.unpriced_s) + " of node-time not priced" : "") + "</p>";
  }

  function figures(doc) {
    var t = doc.total, tps = doc.steps.length === 1 ? doc.steps[0].tokens_per_s : null;
    return '<p class="gp-figures"><b id="goodput-figure" data-goodput="' + (t.goodput === null ? "" : t.goodput) +
      '">goodput ' + pct(t.goodput) + "</b> of " + secs(t.paid_s) + " paid node-time was productive training · " +
      '<span id="goodput-ettr" data-ettr="' + (t.ettr === null ? "" : t.ettr) + '">ETTR ' + pct(t.ettr) + "</span> of " +
      secs(t.node_seconds) + " · " + count(t.tokens) + " tokens kept" +
      (tps !== null && tps !== undefined ? ' · <span id="goodput-tps">' + count(tps) + " tokens/s</span>" : "") + "</p>";
  }

  function stepLine(s) {
    var ck = s.checkpoint, parts = [plural(s.nodes, "node", "nodes"), "wall " + secs(s.wall_s), "goodput " + pct(s.goodput),
      "ETTR " + pct(s.ettr), count(s.tokens) + " tokens kept"];
    if (s.tokens_per_s !== null) parts.push(count(s.tokens_per_s) + " tokens/s of wall time");
    if (s.mean_step_s !== null) parts.push((1000 * s.mean_step_s).toFixed(0) + " ms/step");
    parts.push(plural(s.failures, "failed attempt", "failed attempts") +
      (s.mtbf_s !== null ? " (one per " + secs(s.mtbf_s) + " paid)" : ""));
    if (ck.saves) parts.push(plural(ck.saves, "checkpoint save", "checkpoint saves") + ", " + secs(ck.mean_blocking_s) +
      " blocking each" + (ck.every_steps ? ", every " + ck.every_steps + " steps" : ""));
    return '<p class="gp-step" data-step="' + esc(s.step) + '"><b>step ' + esc(s.step) + "</b>: " + esc(parts.join(" · ")) +
      "</p>";
  }

  function attemptNote(a, causes) {  // its cause when it failed, its steps
    var st = a.steps, why = a.cause ? (causes[a.cause] || a.cause) + " · " : "";
    if (!st || st.first === undefined) return why + (a.measured ? "" : "did not train");
    var ms = 1000 * (st.mean_step_s || 0);
    return why + "steps " + st.first + "→" + st.last + (st.lost ? ", " + st.lost + " recomputed" : "") +
      (ms ? ", " + (ms < 1000 ? ms.toFixed(0) + " ms" : (ms / 1000).toFixed(2) + " s") + "/step" : "");
  }

  function sumStartup(doc) {
    var out = {};
    doc.steps.forEach(function (s) { s.tasks.forEach(function (t) { t.attempts.forEach(function (a) {
      Object.keys(a.startup).forEach(function (k) { out[k] = (out[k] || 0) + a.startup[k]; }); }); }); });
    return out;
  }

  function render(box, d) {
    var doc = d.goodput, labels = d.labels;
    if (!doc) { box.innerHTML = d.error ? '<p class="dim">goodput: not available (' + esc(d.error) + ")</p>" : ""; return; }
    var cats = doc.categories, scale = 0, rows = [];
    doc.steps.forEach(function (s) { s.tasks.forEach(function (t) { t.attempts.forEach(function (a) {
      scale = Math.max(scale, a.wall_s, positive(a.seconds)); }); }); });
    var total = doc.total, totalScale = Math.max(total.node_seconds, positive(total.seconds));
    rows.push(bar("total", "<b>run total</b> (node-time)", total.seconds, total.node_seconds, totalScale, cats, labels,
      sumStartup(doc), "", true));
    doc.steps.forEach(function (s) {
      rows.push(stepLine(s));
      if (doc.steps.length > 1) rows.push(bar("step " + s.step, "step " + esc(s.step) + " (node-time)", s.seconds,
        s.node_seconds, Math.max(s.node_seconds, positive(s.seconds)), cats, labels, {}, "", true));
      s.tasks.forEach(function (t) { t.attempts.forEach(function (a) {
        var label = "node " + (t.node === null ? "?" : t.node) + " · attempt " + a.attempt + ' <span class="status ' +
          esc(a.status) + '">' + esc(a.status) + "</span>";
        rows.push(bar(s.step + "/" + t.task_id + "/" + a.attempt, label, a.seconds, a.wall_s, scale, cats, labels,
          a.startup, attemptNote(a, d.causes || {}), false));
      }); });
    });
    box.innerHTML = figures(doc) + cost(total.cost) + legend(total, cats, labels) + '<div class="gp-bars">' +
      rows.join("") + "</div>" + (doc.notes.length ? '<ul class="dim">' + doc.notes.map(function (n) {
        return "<li>" + esc(n) + "</li>"; }).join("") + "</ul>" : "");
  }

  // the attempts whose ranks waited for slower ones, as the ledger measured it
  function idle(doc) {
    var out = [];
    ((doc && doc.steps) || []).forEach(function (s) { s.tasks.forEach(function (t) { t.attempts.forEach(function (a) {
      var x = a.seconds.straggler_idle;
      if (x > 0) out.push({key: s.step + "/" + t.task_id + "/" + a.attempt, text: s.step + "/" + t.task_id +
        " node " + (t.node === null ? "?" : t.node) + " attempt " + a.attempt + ": its ranks waited " + secs(x) + " (" +
        pct(a.wall_s > 0 ? x / a.wall_s : null) + " of the attempt) for slower ranks (straggler idle, goodput ledger)"});
    }); }); });
    return out;
  }

  return {render: render, idle: idle, secs: secs, pct: pct};
})();
