"""The JSON API under ``/api``: every handler reads the index and the store through :mod:`stoker.ui.data`
and :mod:`stoker.ui.content`; every path component is checked by :mod:`stoker.ui.safe` first."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from stoker.store.records import RUN_STATUSES
from stoker.store.runstate import LOST
from stoker.ui import content, data
from stoker.ui.safe import SERIES_KINDS, STREAMS, attempt_no, choice, component


def _ctx(request: Request):
    return request.app.state.ui


def _run(request: Request) -> tuple[str, str]:
    ui = _ctx(request)
    flow = component(request.path_params["flow"], "flow")
    run_id = component(request.path_params["run"], "run")
    if ui.db.get_run(flow, run_id) is None:
        raise HTTPException(404, f"run {flow}/{run_id} does not exist")
    return flow, run_id


def _task(request: Request) -> tuple[str, str, str, str]:
    flow, run_id = _run(request)
    step = component(request.path_params["step"], "step")
    task_id = component(request.path_params["task"], "task")
    if not data.task_exists(_ctx(request).db, flow, run_id, step, task_id):
        raise HTTPException(404, f"task {flow}/{run_id}/{step}/{task_id} does not exist")
    return flow, run_id, step, task_id


async def runs(request: Request) -> Response:
    q = request.query_params
    status = q.get("status") or None
    if status is not None and status not in (*RUN_STATUSES, LOST):
        raise HTTPException(400, f"status {status!r} is not one of {', '.join((*RUN_STATUSES, LOST))}")
    return JSONResponse(data.list_runs(_ctx(request).db, _ctx(request).store, flow=q.get("flow") or None,
                                       status=status, tag=q.get("tag") or None))


async def run(request: Request) -> Response:
    flow, run_id = _run(request)
    ui = _ctx(request)
    return JSONResponse(data.run_detail(ui.db, ui.store, flow, run_id, ui.home))


def _log(request: Request) -> tuple[bytes, bool, str]:
    flow, run_id = _run(request)
    step = component(request.path_params["step"], "step")
    task_id = component(request.path_params["task"], "task")
    attempt = attempt_no(request.path_params["attempt"])
    stream = choice(request.path_params["stream"], STREAMS, "log stream")
    ui = _ctx(request)
    live = (ui.db.get_attempt(flow, run_id, step, task_id, attempt) is None
            and (step, task_id, attempt) in data.live_attempts(ui.store, ui.home, flow, run_id))
    got = content.read_log(ui.db, ui.store, ui.home, flow, run_id, step, task_id, attempt, stream, live=live)
    if got is None:
        raise HTTPException(404, f"task {flow}/{run_id}/{step}/{task_id} has no attempt {attempt}")
    return got[0], got[1], f"{flow}-{run_id}-{step}-{task_id}-{attempt}-{stream}.log"


async def log(request: Request) -> Response:
    """``?offset=N``: the log from byte N (the browser tails it); ``reset`` when the log got shorter."""
    text, final, _ = _log(request)
    try:
        offset = max(0, int(request.query_params.get("offset", "0")))
    except ValueError:
        raise HTTPException(400, "offset must be an integer") from None
    reset = offset > len(text)
    start = 0 if reset else offset
    return JSONResponse({"text": text[start:].decode("utf-8", "replace"), "offset": len(text), "size": len(text),
                         "final": final, "reset": reset})


async def log_download(request: Request) -> Response:
    text, _, filename = _log(request)
    return Response(text, media_type="text/plain; charset=utf-8",
                    headers={"Content-Disposition": f'attachment; filename="{filename}"'})


async def series(request: Request) -> Response:
    flow, run_id = _run(request)
    kind = choice(request.path_params["kind"], SERIES_KINDS, "series kind")
    return JSONResponse({"kind": kind, "series": _ctx(request).series.series(flow, run_id, kind)})


async def task_artifacts(request: Request) -> Response:
    flow, run_id, step, task_id = _task(request)
    ui = _ctx(request)
    return JSONResponse({"artifacts": content.artifacts(ui.db, ui.store, flow, run_id, step, task_id)})


async def cards(request: Request) -> Response:
    flow, run_id = _run(request)
    return JSONResponse({"cards": content.cards(_ctx(request).store, flow, run_id)})


async def card(request: Request) -> Response:
    flow, run_id = _run(request)
    p = request.path_params
    step, task_id = component(p["step"], "step"), component(p["task"], "task")
    html = content.card_html(_ctx(request).store, flow, run_id, step, task_id, attempt_no(p["attempt"]),
                             component(p["card"], "card"))
    if html is None:
        raise HTTPException(404, "no such card")
    # a card is self-contained: it may run its own scripts, but in a sandbox, without this origin's cookies
    return Response(html, media_type="text/html; charset=utf-8",
                    headers={"Content-Security-Policy": "sandbox allow-scripts; default-src 'none'; "
                             "img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"})


async def goodput(request: Request) -> Response:
    """The run's goodput ledger (``null`` when no step trained) with the labels of its categories."""
    flow, run_id = _run(request)
    ui = _ctx(request)
    rec = ui.db.get_run(flow, run_id)
    finished = rec is not None and rec.status != "running"
    return JSONResponse(ui.ledgers.ledger(flow, run_id, finished=finished))


async def pipeline(request: Request) -> Response:
    flow, run_id = _run(request)
    ui = _ctx(request)
    return JSONResponse({"pipeline": content.pipeline(ui.db, ui.store, flow, run_id)})


_R = "/api/runs/{flow}/{run}"
_T = _R + "/tasks/{step}/{task}"
routes = [
    Route("/api/runs", runs),
    Route(_R, run),
    Route(_T + "/artifacts", task_artifacts),
    Route(_T + "/logs/{attempt}/{stream}", log),
    Route(_T + "/logs/{attempt}/{stream}/download", log_download),
    Route(_R + "/series/{kind}", series),
    Route(_R + "/cards", cards),
    Route(_R + "/cards/{step}/{task}/{attempt}/{card}", card),
    Route(_R + "/pipeline", pipeline),
    Route(_R + "/goodput", goodput),
]
