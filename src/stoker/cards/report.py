"""`stoker report FLOW/RUN[/STEP]`: one self-contained HTML file of a run, to attach to a ticket or a PR.

It holds the run's summary, a table of steps (state, duration, tasks, attempts), every failed attempt with the
tail of its log, the training metrics charts (from the metrics series), the monitor charts, and every card of
the run. CSS and SVG are inline; there is no script and no external reference, so it opens offline.
"""

from __future__ import annotations

import datetime as dt
import html
from typing import Any

from stoker.cards.default_card import human_duration
from stoker.cards.monitor_card import latest_monitor_attempt, monitor_components, read_monitor_samples
from stoker.cards.render import card_body_html, component_html, page
from stoker.cards.store import list_cards, task_ids_with_cards
from stoker.cards.svg import line_chart
from stoker.store.blobs import BlobStore

METRIC_ORDER = ("loss", "eval_loss", "lr", "grad_norm", "tokens_per_s", "mfu", "mem_gb")
_NOT_METRICS = {"step", "time", "attempt", "run_id", "rank", "epoch", "step_name", "task_id", "node"}
LOG_TAIL = 40


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v), quote=True)


def _when(t: dt.datetime | None) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S") if t else "-"


def _secs(a: dt.datetime | None, b: dt.datetime | None) -> float | None:
    return (b - a).total_seconds() if a and b else None


def _step_row(step: Any) -> tuple[list[str], list[Any]]:
    tasks = list(step)
    attempts = [a for t in tasks for a in t.attempts]
    ok = sum(1 for t in tasks if t.successful)
    if tasks and all(t.finished for t in tasks):
        state = "ok" if ok == len(tasks) else "failed"
    else:
        state = "running"
    starts = [t.created_at for t in attempts if t.created_at]
    ends = [t.finished_at for t in attempts if t.finished_at]
    took = _secs(min(starts), max(ends)) if starts and ends and state != "running" else None
    row = [step.id, state, f"{ok}/{len(tasks)}", str(len(attempts)), _when(min(starts) if starts else None),
           human_duration(took) if took is not None else "-"]
    return row, tasks


def _metrics(store: BlobStore, db: Any, flow: str, run_id: str, step: str, task_id: str) -> list[dict[str, Any]]:
    try:
        from stoker.store.metrics import task_metrics

        return task_metrics(db, store, flow, run_id, step, task_id)
    except ImportError:  # the metrics reader is not in this tree: read this run's series directly
        from stoker.store.series import read_series

        base = f"runs/{flow}/{run_id}/metrics/{step}/{task_id}/"
        attempts = sorted({int(a) for a in (n[len(base):].split("/", 1)[0] for n in store.list(base))
                           if a.isdigit()})
        return [r for a in attempts for r in read_series(store, f"{base}{a}/")]


def metrics_charts(records: list[dict[str, Any]], where: str) -> list[str]:
    """One SVG line chart per numeric metric against the training step (a retry's records replace the earlier
    attempt's from the step where it resumed)."""
    by_step: dict[Any, dict[str, Any]] = {}
    for r in records:
        if isinstance(r.get("step"), (int, float)):
            by_step[r["step"]] = {**by_step.get(r["step"], {}), **r}
    keys: list[str] = []
    for r in by_step.values():
        for k, v in r.items():
            if k not in _NOT_METRICS and k not in keys and isinstance(v, (int, float)) and not isinstance(v, bool):
                keys.append(k)
    keys.sort(key=lambda k: (METRIC_ORDER.index(k) if k in METRIC_ORDER else len(METRIC_ORDER), k))
    charts = []
    for k in keys:
        pts = [(s, r[k]) for s, r in sorted(by_step.items()) if isinstance(r.get(k), (int, float))]
        charts.append(line_chart({k: pts}, title=f"{k} ({where})", x_label="step", y_label=k))
    return charts


def build_report(run_pathspec: str, step_name: str | None = None, store: BlobStore | None = None) -> str:
    """The report's HTML for FLOW/RUN (only STEP's details when given)."""
    # long on purpose: the page's sections in the order they appear, each a few lines of markup
    from stoker.client import Run

    run = Run(run_pathspec, store=store)
    store = run._store
    db = run._db
    flow, run_id = run.flow_name, run.id
    steps = sorted(run, key=lambda s: s.created_at or dt.datetime.min)
    if step_name is not None:
        if step_name not in {s.id for s in steps}:
            from stoker.errors import ConfigError

            raise ConfigError(f"report {run_pathspec}/{step_name}: the run has no step {step_name!r} (steps: "
                              f"{', '.join(s.id for s in steps)})")
    took = _secs(run.created_at, run.finished_at)
    out: list[str] = [
        f'<header class="card-head"><h1>Run {_e(run.pathspec)}</h1><div class="meta">status '
        f'<span class="{_e(_state_class(run.status))}">{_e(run.status)}</span> · user {_e(run.user)} · started '
        f'{_e(_when(run.created_at))} · took {_e(human_duration(took) if took is not None else "-")}'
        + (f" · resumed from {_e(run.origin_run_id)}" if run.origin_run_id else "")
        + (f" · tags {_e(', '.join(sorted(run.user_tags)))}" if run.user_tags else "") + "</div></header>"]
    if run.parameters:
        rows = [[k, repr(v)] for k, v in sorted(run.parameters.items())]
        out.append(_section("Parameters", component_html({"type": "table", "headers": ["name", "value"],
                                                           "data": rows})))
    step_rows, step_tasks = [], {}
    for s in steps:
        row, tasks = _step_row(s)
        step_rows.append(row)
        step_tasks[s.id] = tasks
    table = ["<table><thead><tr>" + "".join(f"<th>{h}</th>" for h in ("step", "state", "tasks ok", "attempts",
                                                                        "started", "duration"))
             + "</tr></thead><tbody>"]
    for row in step_rows:
        table.append("<tr>" + "".join(f'<td class="{_e(_state_class(v))}">{_e(v)}</td>' if i == 1 else
                                      f"<td>{_e(v)}</td>" for i, v in enumerate(row)) + "</tr>")
    table.append("</tbody></table>")
    out.append(_section("Steps", "".join(table)))
    chosen = [s for s in steps if step_name is None or s.id == step_name]
    failures = []
    for s in chosen:
        for t in step_tasks[s.id]:
            for a in t.attempts:
                if a.finished and not a.successful:
                    exc = a.exception
                    logs = "".join(f"<details open><summary>last {LOG_TAIL} lines of {name}</summary>"
                                   f"<pre>{_e(_tail(a, name)) or '(empty)'}</pre></details>"
                                   for name in ("stderr", "stdout"))
                    failures.append(f"<h3>{_e(a.pathspec)} attempt {a.current_attempt}</h3>"
                                    f'<pre class="error">{_e(f"{exc.type}: {exc.message}" if exc else "failed")}</pre>'
                                    + logs)
    if failures:
        out.append(_section("Failures", "".join(failures)))
    charts = []
    for s in chosen:
        for t in step_tasks[s.id]:
            recs = _metrics(store, db, flow, run_id, s.id, t.id)
            if recs:
                charts.append(f"<h3>{_e(s.id)}/{_e(t.id)}</h3>" + "".join(metrics_charts(recs, f"{s.id}/{t.id}")))
    if charts:
        out.append(_section("Training metrics", "".join(charts)))
    mons = []
    for s in chosen:
        for t in step_tasks[s.id]:
            a = latest_monitor_attempt(store, flow, run_id, s.id, t.id)
            if a is None:
                continue
            comps = monitor_components(read_monitor_samples(store, flow, run_id, s.id, t.id, a))[1:]
            mons.append(f"<h3>{_e(s.id)}/{_e(t.id)} attempt {a}</h3>" + "".join(component_html(c) for c in comps))
    if mons:
        out.append(_section("Monitor", "".join(mons)))
    cards = []
    for s in chosen:
        for task_id in task_ids_with_cards(store, flow, run_id, s.id):
            for ref in list_cards(store, flow, run_id, s.id, task_id):
                if ref.id == "monitor" and mons:
                    continue  # the same charts are in the Monitor section
                try:
                    body = card_body_html(ref.data(store))
                except Exception as e:  # noqa: BLE001 - one unreadable card must not lose the report
                    body = f'<p class="error">card {_e(ref.id)}: {_e(type(e).__name__)}: {_e(e)}</p>'
                cards.append(f'<div class="card-embed"><h3>{_e(s.id)}/{_e(task_id)} · card {_e(ref.id)}</h3>'
                             f"{body}</div>")
    if cards:
        out.append(_section("Cards", "".join(cards)))
    gen = dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    out.append(f'<p class="meta">Generated by stoker report at {_e(gen)} from {_e(store.url)}.</p>')
    return page(f"stoker report {run.pathspec}", "\n".join(out))


def _tail(task: Any, stream: str) -> str:
    try:
        return "\n".join(getattr(task, stream).splitlines()[-LOG_TAIL:])
    except Exception as e:  # noqa: BLE001 - a missing log must not lose the report
        return f"({stream} not readable: {type(e).__name__}: {e})"


def _state_class(state: str) -> str:
    return {"ok": "ok", "succeeded": "ok", "failed": "failed", "killed": "failed", "running": "running"}.get(state, "")


def _section(title: str, body: str) -> str:
    return f'<section class="component"><h2>{_e(title)}</h2>{body}</section>'
