"""Server-rendered pages: the runs list and a run's page. The HTML carries the first state; ui.js keeps it
live by polling the JSON API (every ~2 s) and draws the charts with the vendored chart.js."""

from __future__ import annotations

import datetime as dt
import json
from html import escape

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from stoker.ui import data
from stoker.ui.safe import component

NODE_W, NODE_H, GAP_X, GAP_Y = 150, 36, 40, 28


def _when(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def _took(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def _page(title: str, body: str, page: str, state: dict) -> HTMLResponse:
    blob = json.dumps(state).replace("</", "<\\/")  # never closes the script element
    return HTMLResponse(f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)} · stoker</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="/static/ui.css"></head>
<body data-page="{page}"><header><a href="/" class="brand">stoker</a> <span>{escape(title)}</span></header>
<main>{body}</main>
<script id="state" type="application/json">{blob}</script>
<script src="/static/chart.js"></script><script src="/static/goodput.js"></script>
<script src="/static/ui.js"></script></body></html>""")


def run_row(r: dict) -> str:
    href = f"/runs/{escape(r['flow'])}/{escape(r['run_id'])}"
    tags = " ".join(f'<span class="tag">{escape(t)}</span>' for t in r["tags"])
    return (f'<tr data-run="{escape(r["flow"])}/{escape(r["run_id"])}" data-status="{escape(r["status"])}">'
            f'<td>{escape(r["flow"])}</td><td><a href="{href}">{escape(r["run_id"])}</a></td>'
            f'<td><span class="status {escape(r["status"])}" title="{escape(r.get("note") or "")}">'
            f'{escape(r["status"])}</span></td>'
            f'<td>{escape(r["user"] or "-")}</td><td>{_when(r["created_at"])}</td>'
            f'<td>{_took(r["duration"])}</td><td>{tags}</td></tr>')


async def runs_page(request: Request) -> Response:
    q = request.query_params
    ui = request.app.state.ui
    listing = data.list_runs(ui.db, ui.store, flow=q.get("flow") or None, status=q.get("status") or None,
                             tag=q.get("tag") or None)
    flows = "".join(f'<option{" selected" if f == q.get("flow") else ""}>{escape(f)}</option>'
                    for f in listing["flows"])
    statuses = "".join(f'<option{" selected" if s == q.get("status") else ""}>{s}</option>'
                       for s in ("running", "succeeded", "failed", "killed", "lost"))
    body = f"""<form id="filters" class="filters">
<label>flow <select name="flow"><option value="">all</option>{flows}</select></label>
<label>status <select name="status"><option value="">all</option>{statuses}</select></label>
<label>tag <input name="tag" value="{escape(q.get('tag') or '')}" placeholder="tag"></label>
<button type="submit">filter</button> <span id="updated" class="dim"></span></form>
<table id="runs" class="grid"><thead><tr><th>flow</th><th>run</th><th>status</th><th>user</th><th>started</th>
<th>took</th><th>tags</th></tr></thead><tbody>{''.join(run_row(r) for r in listing['runs'])}</tbody></table>"""
    return _page("runs", body, "runs", {"filters": dict(q)})


def dag_svg(dag: dict) -> str:
    """The DAG as layered boxes: a column per layer, one box per step, coloured by state."""
    pos = {n["name"]: (20 + n["layer"] * (NODE_W + GAP_X), 10 + n["slot"] * (NODE_H + GAP_Y)) for n in dag["nodes"]}
    width = 40 + dag["layers"] * (NODE_W + GAP_X)
    height = 20 + max(dag["width"], 1) * (NODE_H + GAP_Y)
    parts = []
    for a, b in dag["edges"]:
        (x1, y1), (x2, y2) = pos[a], pos[b]
        parts.append(f'<path class="edge" d="M{x1 + NODE_W},{y1 + NODE_H / 2} C{x1 + NODE_W + GAP_X / 2},'
                     f'{y1 + NODE_H / 2} {x2 - GAP_X / 2},{y2 + NODE_H / 2} {x2},{y2 + NODE_H / 2}"/>')
    for n in dag["nodes"]:
        x, y = pos[n["name"]]
        parts.append(f'<g class="step {escape(n["state"])}" data-step="{escape(n["name"])}" '
                     f'data-state="{escape(n["state"])}" transform="translate({x},{y})">'
                     f'<rect width="{NODE_W}" height="{NODE_H}" rx="6"/>'
                     f'<text x="{NODE_W / 2}" y="{NODE_H / 2 + 5}">{escape(n["name"])}</text></g>')
    return (f'<svg id="dag" width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
            f'{"".join(parts)}</svg>')


async def run_page(request: Request) -> Response:
    flow = component(request.path_params["flow"], "flow")
    run_id = component(request.path_params["run"], "run")
    ui = request.app.state.ui
    detail = data.run_detail(ui.db, ui.store, flow, run_id, ui.home)
    if detail is None:
        raise HTTPException(404, f"run {flow}/{run_id} does not exist")
    r = detail["run"]
    params = ", ".join(f"{escape(k)}={escape(repr(v))}" for k, v in detail["params"].items()) or "-"
    body = f"""<section class="summary"><h1>{escape(flow)}/{escape(run_id)}
<span id="run-status" class="status {escape(r['status'])}" title="{escape(r['note'] or '')}" \
data-status="{escape(r['status'])}">{escape(r['status'])}</span></h1>
<p>user {escape(r['user'] or '-')} · started {_when(r['created_at'])} · took \
<span id="run-took">{_took(r['duration'])}</span>
· tags {escape(', '.join(r['tags']) or '-')} · parameters {params}</p>
<p id="run-note" class="failure"{'' if r['note'] else ' hidden'}>{escape(r['note'] or '')}</p>
<div id="failure" class="failure" hidden></div></section>
<section><h2>DAG</h2><div id="dag-box">{dag_svg(detail['dag'])}</div></section>
<section><h2>Tasks</h2><table id="tasks" class="grid"><thead><tr><th>step</th><th>task</th><th>node</th>
<th>attempt</th><th>status</th><th>took</th><th>host</th><th></th></tr></thead><tbody></tbody></table></section>
<section id="generations" hidden><h2>Gang generations (hot spares)</h2><ul id="generation-list" class="generations">\
</ul></section>
<section id="failed-attempts" hidden><h2>Failed attempts</h2><ul id="failed-list" class="failures"></ul></section>
<section id="goodput" hidden><h2>Where the time went (goodput)</h2><div id="goodput-body"></div></section>
<section id="pipeline" hidden><h2>Pretraining pipeline</h2><div id="pipeline-body"></div></section>
<section><h2>Training metrics</h2><label class="dim">x axis <select id="xaxis"><option value="step">step</option>
<option value="time">time</option></select></label>
<ul id="stragglers" class="stragglers" hidden></ul><div id="metric-charts" class="charts"></div></section>
<section><h2>Devices</h2><div id="monitor-charts" class="charts"></div></section>
<section id="logs"><h2>Logs</h2><div class="logbar"><select id="log-pick"></select>
<select id="log-stream"><option>stdout</option><option>stderr</option></select>
<input id="log-filter" placeholder="filter lines"> <a id="log-download" href="#">download</a>
<span id="log-state" class="dim"></span></div><pre id="log-text"></pre></section>
<section><h2>Artifacts</h2><select id="art-pick"></select><table id="artifacts" class="grid"><thead><tr><th>name</th>
<th>type</th><th>size</th><th>preview</th></tr></thead><tbody></tbody></table></section>
<section id="cards-section" hidden><h2>Cards</h2><div id="cards"></div></section>"""
    return _page(f"{flow}/{run_id}", body, "run", {"flow": flow, "run_id": run_id, "detail": detail})


routes = [Route("/", runs_page), Route("/runs/{flow}/{run}", run_page)]
