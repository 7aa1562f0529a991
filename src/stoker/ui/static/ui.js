/* stoker ui: keeps the server-rendered pages live by polling the JSON API (every 2 s). */
(function () {
  "use strict";
  var POLL_MS = 2000;
  var state = JSON.parse(document.getElementById("state").textContent);
  var page = document.body.dataset.page;

  function $(id) { return document.getElementById(id); }
  function esc(s) { return String(s === null || s === undefined ? "" : s).replace(/[&<>"']/g, function (c) {
    return {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]; }); }
  function when(ts) { if (!ts) return "-"; var d = new Date(ts * 1000); return d.toLocaleString(); }
  function took(s) { if (s === null || s === undefined) return "-";
    return s < 120 ? s.toFixed(1) + " s" : s < 7200 ? (s / 60).toFixed(1) + " min" : (s / 3600).toFixed(1) + " h"; }
  function getJSON(url) { return fetch(url, {credentials: "same-origin"}).then(function (r) {
    if (!r.ok) throw new Error(url + ": " + r.status); return r.json(); }); }
  function status(s, note) {
    return '<span class="status ' + esc(s) + '"' + (note ? ' title="' + esc(note) + '"' : "") + ">" + esc(s) + "</span>"; }
  function cause(x) {  // a failed attempt's cause and evidence (docs/operations.md, "Why an attempt failed")
    if (!x.cause) return '<span class="err">' + esc(x.type + ": " + x.message) + "</span>";
    return '<span class="cause" data-cause="' + esc(x.cause) + '">' + esc(x.cause_label) + "</span>" +
      (x.evidence ? '<span class="evidence">: ' + esc(x.evidence) + "</span>" : ""); }

  // ---- runs list ----------------------------------------------------------------------------------------
  function runsPage() {
    var q = new URLSearchParams(state.filters || {}).toString();
    function tick() {
      getJSON("/api/runs" + (q ? "?" + q : "")).then(function (d) {
        $("runs").tBodies[0].innerHTML = d.runs.map(function (r) {
          var href = "/runs/" + encodeURIComponent(r.flow) + "/" + encodeURIComponent(r.run_id);
          return '<tr data-run="' + esc(r.flow + "/" + r.run_id) + '" data-status="' + esc(r.status) + '"><td>' +
            esc(r.flow) + '</td><td><a href="' + href + '">' + esc(r.run_id) + "</a></td><td>" + status(r.status, r.note) +
            "</td><td>" + esc(r.user || "-") + "</td><td>" + when(r.created_at) + "</td><td>" + took(r.duration) +
            "</td><td>" + r.tags.map(function (t) { return '<span class="tag">' + esc(t) + "</span>"; }).join(" ") + "</td></tr>";
        }).join("");
        $("updated").textContent = "updated " + new Date().toLocaleTimeString();
      }).catch(function (e) { $("updated").textContent = String(e); });
    }
    setInterval(tick, POLL_MS);
  }

  // ---- run page -----------------------------------------------------------------------------------------
  var base, detail, logSel = null, logText = "", logOffset = 0, logFinal = false, lastStatus = null, ledger = null;
  var series = {metrics: [], monitor: []};

  function dagSvg(dag) {
    var W = 150, H = 36, GX = 40, GY = 28, pos = {}, out = [];
    dag.nodes.forEach(function (n) { pos[n.name] = [20 + n.layer * (W + GX), 10 + n.slot * (H + GY)]; });
    var width = 40 + dag.layers * (W + GX), height = 20 + Math.max(dag.width, 1) * (H + GY);
    dag.edges.forEach(function (e) {
      var a = pos[e[0]], b = pos[e[1]];
      out.push('<path class="edge" d="M' + (a[0] + W) + "," + (a[1] + H / 2) + " C" + (a[0] + W + GX / 2) + "," +
        (a[1] + H / 2) + " " + (b[0] - GX / 2) + "," + (b[1] + H / 2) + " " + b[0] + "," + (b[1] + H / 2) + '"/>');
    });
    dag.nodes.forEach(function (n) {
      var p = pos[n.name];
      out.push('<g class="step ' + esc(n.state) + '" data-step="' + esc(n.name) + '" data-state="' + esc(n.state) +
        '" transform="translate(' + p[0] + "," + p[1] + ')"><rect width="' + W + '" height="' + H + '" rx="6"/><text x="' +
        W / 2 + '" y="' + (H / 2 + 5) + '">' + esc(n.name) + "</text></g>");
    });
    return '<svg id="dag" width="' + width + '" height="' + height + '" viewBox="0 0 ' + width + " " + height + '">' +
      out.join("") + "</svg>";
  }

  function logKey(t, a) { return t.step + "/" + t.task_id + "/" + a.attempt; }

  function renderRun(d) {
    detail = d;
    var r = d.run, st = $("run-status");
    st.className = "status " + r.status; st.dataset.status = r.status; st.textContent = r.status;
    st.title = r.note || ""; $("run-note").hidden = !r.note; $("run-note").textContent = r.note || "";
    $("run-took").textContent = took(r.duration);
    $("dag-box").innerHTML = dagSvg(d.dag);
    var f = d.failure, box = $("failure");
    box.hidden = !f;
    if (f) box.innerHTML = "<b>failed: " + esc(f.step) + "/" + esc(f.task_id) + (f.node !== null ? " (gang node " + f.node +
      ", the first to fail)" : "") + " attempt " + f.attempt + "</b>: " + (f.cause ? "cause: " + cause(f) + "<br>" : "") +
      esc(f.type) + ": " + esc(f.message) + (f.traceback ? "<pre>" + esc(f.traceback) + "</pre>" : "");
    drawFailed(d);
    drawGenerations(d);
    $("tasks").tBodies[0].innerHTML = d.tasks.map(function (t) {
      return t.attempts.map(function (a) {
        return '<tr data-task="' + esc(t.step + "/" + t.task_id) + '"><td>' + esc(t.step) + "</td><td>" + esc(t.task_id) +
          "</td><td>" + (a.node === null ? "" : a.node) + "</td><td>" + a.attempt + "</td><td>" + status(a.status) +
          (a.exception ? ' <span class="why" title="' + esc(a.exception.type + ": " + a.exception.message) + '">' +
            cause(a.exception) + "</span>" : "") +
          "</td><td>" + took(a.duration) + "</td><td>" + esc(a.hostname || "") + '</td><td><a href="#logs" data-log="' +
          esc(logKey(t, a)) + '">log</a></td></tr>';
      }).join("");
    }).join("");
    var pick = $("log-pick"), keep = pick.value, opts = [];
    d.tasks.forEach(function (t) { t.attempts.forEach(function (a) {
      opts.push('<option value="' + esc(logKey(t, a)) + '">' + esc(t.step + "/" + t.task_id) +
        (a.node !== null ? " node " + a.node : "") + " attempt " + a.attempt + " (" + esc(a.status) + ")</option>");
    }); });
    pick.innerHTML = opts.join("");
    if (keep) pick.value = keep;
    var art = $("art-pick"), keepArt = art.value;
    art.innerHTML = d.tasks.map(function (t) { var k = t.step + "/" + t.task_id;
      return '<option value="' + esc(k) + '">' + esc(k) + "</option>"; }).join("");
    if (keepArt) art.value = keepArt;
    if (!logSel && pick.value) {  // a failed run opens on the failing task's stderr, where its error is
      if (d.failure) $("log-stream").value = "stderr";
      selectLog(failedLog(d) || pick.value);
    }
    if (!keepArt && art.value) loadArtifacts();
  }

  function drawFailed(d) {  // every failed attempt with its cause, and what came of it
    var items = [];
    d.tasks.forEach(function (t) { t.attempts.forEach(function (a, i) {
      if (a.status !== "failed" || !a.exception) return;
      var next = t.attempts[i + 1], key = logKey(t, a);
      items.push('<li data-attempt="' + esc(key) + '" data-cause="' + esc(a.exception.cause || "") + '"><b>' +
        esc(t.step + "/" + t.task_id) + (a.node !== null ? " node " + a.node : "") + " attempt " + a.attempt + "</b> " +
        cause(a.exception) + (a.exception.cause ? ' <span class="dim">(' + esc(a.exception.type + ": " +
        a.exception.message) + ")</span>" : "") + (next ? ' <span class="dim">→ retried: attempt ' + next.attempt + " " +
        esc(next.status) + "</span>" : "") + ' <a href="#logs" data-log="' + esc(key) + '">log</a></li>');
    }); });
    $("failed-attempts").hidden = !items.length;
    $("failed-list").innerHTML = items.join("");
  }

  function drawGenerations(d) {  // gangs with hot spares: each generation, which node left, who joined, recovery
    var items = [];
    (d.gangs || []).forEach(function (g) {
      g.generations.forEach(function (x) {
        var key = g.step + "/" + g.task_id + "/" + g.attempt + "/" + x.gen, l = x.lost, text;
        if (!l) text = "members " + x.slots.join(", ") + " run nodes 0-" + (x.slots.length - 1);
        else text = '<span class="gen-lost">node ' + esc(l.slot) + " left</span> (member " + esc(l.member) + ", host " +
          esc(l.host || "?") + "): " + esc(l.why || "lost") + "; spare member " + esc(x.joined) +
          (x.joined_host ? " (host " + esc(x.joined_host) + ")" : "") + " took its place; " +
          (x.recovery_s !== null ? '<span class="gen-recovery">recovered in ' + x.recovery_s.toFixed(1) + " s</span>" :
           "not training yet");
        items.push('<li data-generation="' + esc(key) + '" data-recovery="' + esc(x.recovery_s === null ? "" :
          x.recovery_s) + '"><b>' + esc(g.step) + " attempt " + g.attempt + ", generation " + x.gen + "</b> " + text +
          "</li>");
      });
    });
    $("generations").hidden = !items.length;
    $("generation-list").innerHTML = items.join("");
  }

  function failedLog(d) {  // the failing task's log, else the newest running task's
    if (d.failure) return d.failure.step + "/" + d.failure.task_id + "/" + d.failure.attempt;
    var live = null;
    d.tasks.forEach(function (t) { t.attempts.forEach(function (a) { if (a.status === "running") live = logKey(t, a); }); });
    return live;
  }

  function logUrl() { return base + "/tasks/" + logSel.split("/").slice(0, 2).join("/") + "/logs/" +
    logSel.split("/")[2] + "/" + $("log-stream").value; }

  function selectLog(key) {
    logSel = key; $("log-pick").value = key; logText = ""; logOffset = 0; logFinal = false;
    $("log-download").href = logUrl() + "/download";
    tailLog();
  }

  function showLog() {
    var needle = $("log-filter").value.toLowerCase(), lines = logText.split("\n");
    if (needle) lines = lines.filter(function (l) { return l.toLowerCase().indexOf(needle) >= 0; });
    $("log-text").textContent = lines.join("\n");
  }

  function tailLog() {
    if (!logSel || logFinal) return;
    var key = logSel;
    getJSON(logUrl() + "?offset=" + logOffset).then(function (d) {
      if (key !== logSel) return;
      logText = d.reset ? d.text : logText + d.text; logOffset = d.offset; logFinal = d.final;
      $("log-state").textContent = d.final ? "complete" : "live";
      showLog();
    }).catch(function (e) { $("log-state").textContent = String(e); });
  }

  function loadArtifacts() {
    var k = $("art-pick").value;
    if (!k) return;
    getJSON(base + "/tasks/" + k + "/artifacts").then(function (d) {
      $("artifacts").tBodies[0].innerHTML = d.artifacts.map(function (a) {
        return '<tr data-artifact="' + esc(a.name) + '"><td>' + esc(a.name) + "</td><td>" + esc(a.type) + "</td><td>" +
          (a.size === null ? "" : a.size) + "</td><td><pre>" + esc(a.preview) + "</pre></td></tr>";
      }).join("");
    });
  }

  var METRICS = [["loss", "loss"], ["tokens_per_s", "throughput (tokens/s)"], ["mfu", "MFU"], ["lr", "learning rate"],
                 ["grad_norm", "grad norm"], ["mem_gb", "memory (GB)"],
                 ["straggler_score", "slowest rank's score (median busy time / its own)"]];

  function drawStragglers() {  // the ranks and nodes a trainer named (stoker.train.stragglers), longest streak each
    var named = {}, box = $("stragglers");
    series.metrics.forEach(function (s) { s.records.forEach(function (r) { (r.stragglers || []).forEach(function (x) {
      var k = [s.step, s.task_id, s.attempt, x.kind, x.node, x.rank].join("/");
      if (!named[k] || x.windows >= named[k].x.windows) named[k] = {s: s, x: x};
    }); }); });
    var keys = Object.keys(named);
    var idle = StokerGoodput.idle(ledger);  // the time ranks waited for the slow ones, when the ledger measured it
    box.hidden = !keys.length && !idle.length;
    box.innerHTML = keys.map(function (k) { var n = named[k];
      return '<li data-straggler="' + esc(n.x.kind + " " + (n.x.kind === "node" ? n.x.node : n.x.rank)) + '">' +
        esc(n.s.step + "/" + n.s.task_id + " attempt " + n.s.attempt + ": " + n.x.message) + "</li>"; }).join("") +
      idle.map(function (x) { return '<li data-straggler-idle="' + esc(x.key) + '">' + esc(x.text) + "</li>"; }).join("");
  }

  function chartBox(parent, id) {
    var box = $(id);
    if (!box) { box = document.createElement("div"); box.id = id; parent.appendChild(box); }
    return box;
  }

  function drawMetrics() {
    var byTime = $("xaxis").value === "time", t0 = Infinity;
    series.metrics.forEach(function (s) { s.records.forEach(function (r) { if (r.time < t0) t0 = r.time; }); });
    METRICS.forEach(function (m, i) {
      var sets = series.metrics.map(function (s) {
        return {name: s.step + "/" + s.task_id + " attempt " + s.attempt, points: s.records.filter(function (r) {
          return typeof r[m[0]] === "number"; }).map(function (r) { return [byTime ? r.time - t0 : r.step, r[m[0]]]; })};
      });
      var has = sets.some(function (s) { return s.points.length; });
      if (!has && i > 1 && !$("chart-" + m[0])) return;  // optional metrics appear when logged
      var box = chartBox($("metric-charts"), "chart-" + m[0]);
      box.dataset.metric = m[0];
      StokerChart.line(box, {title: m[1], series: sets, xLabel: byTime ? "time" : "step", xTime: byTime});
    });
  }

  function drawMonitor() {
    var parent = $("monitor-charts");
    if (!series.monitor.length) { parent.innerHTML = '<p class="dim">no device samples: add @monitor to a step</p>'; return; }
    var hint = parent.querySelector("p.dim"); if (hint) hint.remove();
    series.monitor.forEach(function (s) {
      var t0 = s.records.length ? s.records[0].time : 0, util = {}, mem = {};
      function add(group, name, r, v) { if (typeof v !== "number") return;
        (group[name] = group[name] || []).push([r.time - t0, v]); }
      s.records.forEach(function (r) {
        add(util, "cpu %", r, r.cpu_percent);
        add(mem, "task RSS MB", r, r.rss_mb);
        add(mem, "host used MB", r, r.host_mem_used_mb);
        (r.gpus || []).forEach(function (g) { add(util, "gpu" + g.index + " %", r, g.util);
          add(mem, "gpu" + g.index + " MB", r, g.mem_used_mb); });
        var n = r.neuron || {};
        (n.cores || []).forEach(function (c) { add(util, "nc" + c.index + " %", r, c.util); });
        add(mem, "neuron device MB", r, n.device_mem_used_mb);
      });
      var label = s.step + "/" + s.task_id + " node " + (s.node === null ? 0 : s.node) + " attempt " + s.attempt;
      var id = "mon-" + [s.step, s.task_id, s.attempt, s.node].join("-");
      [["util", util, "utilisation (%)"], ["mem", mem, "memory (MB)"]].forEach(function (c) {
        var box = chartBox(parent, id + "-" + c[0]);
        StokerChart.line(box, {title: label + ": " + c[2], xLabel: "time", xTime: true,
          series: Object.keys(c[1]).map(function (k) { return {name: k, points: c[1][k]}; })});
      });
    });
  }

  function loadSeries() {
    getJSON(base + "/series/metrics").then(function (d) { series.metrics = d.series; drawMetrics(); drawStragglers(); });
    getJSON(base + "/series/monitor").then(function (d) { series.monitor = d.series; drawMonitor(); });
  }

  function loadGoodput() {
    getJSON(base + "/goodput").then(function (d) {
      ledger = d.goodput;
      $("goodput").hidden = !d.goodput && !d.error;  // a run that trained nothing shows nothing
      StokerGoodput.render($("goodput-body"), d);
      $("goodput").dataset.loaded = "1";
      drawStragglers();
    });
  }

  function loadExtras() {
    loadGoodput();
    getJSON(base + "/cards").then(function (d) {
      $("cards-section").hidden = !d.cards.length;
      var box = $("cards"), have = {};
      Array.prototype.forEach.call(box.querySelectorAll("iframe"), function (f) { have[f.dataset.url] = f; });
      d.cards.forEach(function (c) {
        var f = have[c.url];
        if (!f) {
          var h = document.createElement("h3"); h.textContent = c.step + "/" + c.task_id + " attempt " + c.attempt + ": " + c.title;
          f = document.createElement("iframe"); f.dataset.url = c.url; f.setAttribute("sandbox", "allow-scripts");
          box.appendChild(h); box.appendChild(f);
        }
        if (f.dataset.updated !== String(c.updated)) { f.dataset.updated = String(c.updated); f.src = c.url + "?u=" + c.updated; }
      });
    });
    getJSON(base + "/pipeline").then(function (d) {
      var p = d.pipeline;
      $("pipeline").hidden = !p;
      if (!p) return;
      var rows = Object.keys(p.eval).map(function (k) { return "<tr><td>" + esc(k) + "</td><td>" + esc(StokerChart.format(p.eval[k])) + "</td></tr>"; });
      var samples = p.samples.map(function (s) { return '<li class="sample"><b>' + esc(s.prompt) + "</b>" + esc(s.completion) + "</li>"; });
      $("pipeline-body").innerHTML = "<h3>evaluation</h3><table class='grid' id='eval'>" + rows.join("") + "</table>" +
        "<h3>samples</h3><ul>" + samples.join("") + "</ul><h3>export</h3><p id='export-dir'>" + esc(p.export_dir || "-") +
        "</p><h3>checkpoints</h3><p>" + esc(p.checkpoint || "") + "</p><ul id='checkpoints'>" + p.checkpoints.steps.map(function (s) {
          return "<li>" + esc(p.checkpoints.folder + s) + (s === p.checkpoints.latest ? " (latest)" : "") + "</li>"; }).join("") + "</ul>";
    });
  }

  function runPage() {
    base = "/api/runs/" + encodeURIComponent(state.flow) + "/" + encodeURIComponent(state.run_id);
    renderRun(state.detail);
    lastStatus = state.detail.run.status;
    loadSeries(); loadExtras();
    $("log-pick").addEventListener("change", function () { selectLog(this.value); });
    $("log-stream").addEventListener("change", function () { selectLog(logSel); });
    $("log-filter").addEventListener("input", showLog);
    $("art-pick").addEventListener("change", loadArtifacts);
    $("xaxis").addEventListener("change", drawMetrics);
    ["tasks", "failed-list"].forEach(function (id) { $(id).addEventListener("click", function (ev) {
      var k = ev.target.dataset && ev.target.dataset.log; if (k) selectLog(k); }); });
    setInterval(function () {
      if (lastStatus !== "running") return;  // a finished run no longer changes
      getJSON(base).then(function (d) {
        renderRun(d);
        loadSeries(); tailLog();
        if (d.run.status === "running") loadGoodput();
        if (d.run.status !== "running") { lastStatus = d.run.status; loadExtras(); loadArtifacts();
          if (logSel) { logFinal = false; tailLog(); } }
      });
    }, POLL_MS);
  }

  if (page === "runs") runsPage(); else if (page === "run") runPage();
})();
