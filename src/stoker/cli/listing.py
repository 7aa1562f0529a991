"""What `stoker runs` and `stoker show` print: plain text that fits the width (80 columns when not on a terminal,
else the terminal's, `$COLUMNS` first), or with `--json` one JSON document with stable keys (docs/operations.md).

`stoker runs --json`: a list, newest first, of
    {"flow", "run_id", "pathspec", "status", "user", "created_at", "finished_at", "duration_s", "tags"}
`stoker show --json`: one object
    {"flow", "run_id", "pathspec", "status", "user", "created_at", "finished_at", "duration_s", "tags",
     "origin_run_id", "parameters", "steps": [{"name", "tasks": [{"id", "pathspec", "attempt", "successful",
     "finished", "exception": {"type", "message", "cause", "evidence"} | null, "failed_attempts": [{"attempt",
     "type", "message", "cause", "evidence"}], "artifacts": [names], "stragglers": [lines]}],
     "generations": a gang step with hot spares: its gang attempts (stoker.client.gangs.step_gangs), else []}],
     "cost": [lines] | null,
     "goodput": the goodput ledger's summary (stoker.cli.goodput.summary; {"error"} when unreadable) | null,
     "note": why a `lost` run is lost and how to continue it | null}
A run is `lost` when the index says `running` but its driver is gone without recording its end (a full disk,
a killed process: stoker.store.runstate); `stoker runs` prints the command that continues it under the table.
Times are ISO 8601 in UTC (`2026-01-31T12:00:00+00:00`), durations seconds, missing values null.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import textwrap
from typing import Any

from stoker.cli.goodput import summary_lines as goodput_lines
from stoker.client.gangs import generation_lines
from stoker.store.runstate import LOST

DATE = "%Y-%m-%d %H:%M:%S"
SHORT_DATE = "%m-%d %H:%M"


def width() -> int:
    """The width to fit: $COLUMNS, else the terminal's, else 80 (output to a file or a pipe)."""
    return max(40, shutil.get_terminal_size((80, 24)).columns)


def _iso(t: dt.datetime | None) -> str | None:
    if t is None:
        return None
    if t.tzinfo is None:
        t = t.astimezone()
    return t.astimezone(dt.timezone.utc).isoformat(timespec="seconds")


def _duration(run: Any) -> float | None:
    if not run.finished_at or not run.created_at:
        return None
    return round((run.finished_at - run.created_at).total_seconds(), 3)


def run_record(run: Any) -> dict[str, Any]:
    """The stable keys of one run (`stoker runs --json`, the head of `stoker show --json`)."""
    return {"flow": run.flow_name, "run_id": run.id, "pathspec": run.pathspec, "status": run.status,
            "user": run.user, "created_at": _iso(run.created_at), "finished_at": _iso(run.finished_at),
            "duration_s": _duration(run), "tags": sorted(run.user_tags)}


def _fit(text: str, w: int) -> str:
    return text if len(text) <= w else text[: max(w - 1, 0)] + "…"


def runs_table(records: list[dict[str, Any]], created: list[dt.datetime | None], cols: int) -> list[str]:
    """The `stoker runs` table as lines no longer than `cols`. The run id is never cut; a table too wide gets the
    short date, then its tags, user and flow name cut (with "…"), then loses the tags, user, took and started
    columns, in this order, until it fits."""
    def took(r: dict[str, Any]) -> str:
        return f"{r['duration_s']:.1f}s" if r["duration_s"] is not None else "-"

    head = ["flow", "run", "status", "user", "started", "took", "tags"]
    keep = [i for i in range(len(head)) if i != 6 or any(r["tags"] for r in records)]

    def total() -> int:
        return sum(widths[i] for i in keep) + 2 * (len(keep) - 1)

    for fmt in (DATE, SHORT_DATE):
        body = [[r["flow"], r["run_id"], r["status"], r["user"] or "-", c.strftime(fmt) if c else "-", took(r),
                 ", ".join(r["tags"])] for r, c in zip(records, created, strict=True)]
        widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
        if total() <= cols:
            break

    for how, col, floor in (("cut", 6, 8), ("cut", 3, 6), ("cut", 0, 10), ("drop", 6, 0), ("drop", 3, 0),
                            ("cut", 0, 4), ("drop", 5, 0), ("drop", 4, 0)):
        if total() <= cols or col not in keep:
            continue
        if how == "cut":
            widths[col] = max(floor, widths[col] - (total() - cols), len(head[col]))
        else:
            keep.remove(col)
    return ["  ".join(_fit(row[i], widths[i]).ljust(widths[i]) for i in keep).rstrip() for row in [head, *body]]


def print_runs(runs: list[Any], as_json: bool) -> None:
    records = [run_record(r) for r in runs]
    if as_json:
        print(json.dumps(records, indent=1, default=str))
        return
    if not records:
        print("no runs yet (runs of other users: stoker runs --all)")
        return
    print("\n".join(runs_table(records, [r.created_at for r in runs], width())))
    resumed = {(r.flow_name, r.origin_run_id): r.id for r in runs if getattr(r, "origin_run_id", None)}
    for run, rec in zip(runs, records, strict=True):  # a lost run: why, and the command that continues it
        if rec["status"] == LOST:
            by = resumed.get((rec["flow"], rec["run_id"]))
            note = f"{LOST}: {getattr(run, 'lost_reason', None) or rec['pathspec']}" + (
                f" (resumed by run {by})" if by else "")
            print("\n".join(_wrap(note, width(), "")))


def _wrap(text: str, cols: int, indent: str, more: str | None = None) -> list[str]:
    return textwrap.wrap(text, width=cols, initial_indent=indent, subsequent_indent=more or indent + "  ",
                         break_on_hyphens=False, break_long_words=True) or [indent]


def task_stragglers(store: Any, flow: str, run_id: str) -> dict[tuple[str, str], list[str]]:
    """(step, task id) -> the ranks and nodes its trainer named as stragglers (stoker.train.stragglers), from the
    run's metrics series: one line per rank or node and attempt, with its longest streak."""
    from stoker.store.manifest import run_prefix
    from stoker.store.series import read_series, series_prefix

    base = f"{run_prefix(flow, run_id)}metrics/"
    found = {tuple(n[len(base):].split("/")[:3]) for n in store.list(base)}
    out: dict[tuple[str, str], list[str]] = {}
    for step, task_id, attempt in sorted(f for f in found if len(f) == 3 and f[2].isdigit()):
        longest: dict[tuple[Any, ...], dict[str, Any]] = {}
        for record in read_series(store, series_prefix("metrics", flow, run_id, step, task_id, int(attempt))):
            for s in record.get("stragglers") or []:
                key = (s.get("kind"), s.get("node"), s.get("rank"))
                if isinstance(s.get("message"), str) and s.get("windows", 0) >= longest.get(key, {}).get("windows", 0):
                    longest[key] = s
        out.setdefault((step, task_id), []).extend(f"{s['message']} (attempt {attempt})" for s in longest.values())
    return {k: v for k, v in out.items() if v}


def _stragglers(run: Any) -> dict[tuple[str, str], list[str]]:
    from stoker.errors import StokerError

    try:
        return task_stragglers(run._store, run.flow_name, run.id)
    except (StokerError, OSError, ValueError, AttributeError):  # no store here: the rest of `show` still prints
        return {}


def _gangs(run: Any) -> dict[str, list[dict[str, Any]]]:
    """step -> its gang attempts with generations (hot spares: stoker.client.gangs), read once for the run."""
    from stoker.client.gangs import step_gangs
    from stoker.errors import StokerError

    out: dict[str, list[dict[str, Any]]] = {}
    try:
        for gang in step_gangs(run._store, run.flow_name, run.id):
            out.setdefault(gang["step"], []).append(gang)
    except (StokerError, OSError, AttributeError):  # no store here: the rest of `show` still prints
        return {}
    return out


def show_record(run: Any, cost: list[str] | None, goodput: dict[str, Any] | None = None) -> dict[str, Any]:
    """`stoker show --json`: the run, its parameters, every step and task."""
    named = _stragglers(run)
    gangs = _gangs(run)
    steps = []
    for step in run:
        tasks = []
        for t in step:
            exc = t.exception
            tasks.append({"id": t.id, "pathspec": t.pathspec, "attempt": t.retry_count, "successful": t.successful,
                          "finished": t.finished, "exception": _exception(exc) if exc else None,
                          "failed_attempts": failed_attempts(t),
                          "artifacts": sorted(a.id for a in t.artifacts if not a.id.startswith("_")),
                          "stragglers": named.get((step.id, t.id), [])})
        steps.append({"name": step.id, "tasks": tasks, "generations": gangs.get(step.id, [])})
    head = run_record(run)
    note = getattr(run, "lost_reason", None) if head["status"] == LOST else None
    return {**head, "origin_run_id": run.origin_run_id, "parameters": run.parameters, "steps": steps, "cost": cost,
            "goodput": goodput, "note": note}


def _exception(exc: Any) -> dict[str, Any]:
    return {"type": exc.type, "message": exc.message, "cause": getattr(exc, "cause", None),
            "evidence": getattr(exc, "evidence", None)}


def failed_attempts(t: Any) -> list[dict[str, Any]]:
    """Every failed attempt of a task, oldest first, with why it failed (its cause: stoker.runtime.driver.causes)."""
    if t.successful and not t.retry_count:
        return []
    out = []
    for a in t.attempts:
        exc = a.exception if a.finished and not a.successful else None
        if exc is not None:
            out.append({"attempt": a.current_attempt, **_exception(exc)})
    return out


def _cause_line(a: dict[str, Any]) -> str:
    from stoker.runtime.driver.causes import LABELS

    why = LABELS.get(a["cause"], a["cause"]) if a.get("cause") else "cause not recorded"
    return f"attempt {a['attempt']} failed: {why}" + (f": {a['evidence']}" if a.get("evidence") else
                                                      f" ({a['type']}: {a['message']})")


def show_lines(rec: dict[str, Any], created: dt.datetime | None, cols: int) -> list[str]:
    """`stoker show` as lines no longer than `cols` (long lists wrap under their label)."""
    head = f"{rec['pathspec']}  {rec['status']}"
    meta = f"user {rec['user']}  started {created.strftime(DATE) if created else '-'}" + (
        f"  took {rec['duration_s']:.1f}s" if rec["duration_s"] is not None else "") + (
        f"  resumed from {rec['origin_run_id']}" if rec["origin_run_id"] else "")
    out = _wrap(head, cols, "") if len(head) + 2 + len(meta) > cols else []
    out += _wrap(meta, cols, "  ") if out else _wrap(f"{head}  {meta}", cols, "")
    if rec.get("note"):  # a lost run: why, and how to continue it
        out += _wrap(rec["note"], cols, "  ")
    if rec["tags"]:
        out += _wrap("tags: " + ", ".join(rec["tags"]), cols, "")
    if rec["parameters"]:
        out += _wrap("parameters: " + ", ".join(f"{k}={v!r}" for k, v in rec["parameters"].items()), cols, "")
    for step in rec["steps"]:
        tasks = step["tasks"]
        ok = sum(1 for t in tasks if t["successful"])
        out.append(f"  step {step['name']}: {ok}/{len(tasks)} tasks succeeded")
        shown = tasks if len(tasks) <= 8 else tasks[:3]
        for t in shown:
            line = f"task {t['id']} (attempt {t['attempt']})"
            if t["exception"]:
                out += _wrap(f"{line}  {t['exception']['type']}: {t['exception']['message']}", cols, "    ", " " * 6)
            out += _wrap(("" if t["exception"] else f"{line}  ") + "artifacts: " + (", ".join(t["artifacts"]) or "-"),
                         cols, "    " if not t["exception"] else " " * 6, " " * 6)
            for a in t.get("failed_attempts") or []:  # why each attempt failed
                out += _wrap(_cause_line(a), cols, " " * 6, " " * 8)
            for line in t.get("stragglers") or []:  # slow ranks and nodes its trainer named
                out += _wrap(line, cols, " " * 6, " " * 8)
        if len(shown) < len(tasks):
            out.append(f"    ... {len(tasks) - len(shown)} more (stoker show --json lists every task)")
        for gang in step.get("generations") or []:  # a gang with hot spares: which node left, who joined, recovery
            head, *gens = generation_lines(gang)
            out += _wrap(head, cols, "    ", " " * 6)
            for line in gens:
                out += _wrap(line, cols, " " * 6, " " * 8)
    for line in rec["cost"] or []:
        out += _wrap(line, cols, "", "  ")
    for line in goodput_lines(rec.get("goodput"), rec["pathspec"]):
        out += _wrap(line, cols, "", "    ")
    return out
