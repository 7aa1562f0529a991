"""The `stoker ui` web app: Starlette routes for the pages, the JSON API and the vendored static files.

    app = create_app(store=open_store(), db=MetadataDB(default_db_path()), token=None)

With a ``token`` every request must carry it: ``?token=`` (then a cookie is set, so links and the page's own
requests work), the ``stoker_ui_token`` cookie, or ``Authorization: Bearer``; anything else gets a 401.
"""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from stoker.store.blobs import BlobStore
from stoker.store.metadata import MetadataDB
from stoker.ui import api, pages
from stoker.ui.content import SeriesReader
from stoker.ui.goodput import LedgerCache

STATIC = Path(__file__).parent / "static"
COOKIE = "stoker_ui_token"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def is_loopback(host: str) -> bool:
    """Whether binding to ``host`` keeps the UI on this machine."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class UIState:
    store: BlobStore
    db: MetadataDB
    home: Path
    series: SeriesReader = field(init=False)
    ledgers: LedgerCache = field(init=False)

    def __post_init__(self) -> None:
        self.series = SeriesReader(self.store)
        self.ledgers = LedgerCache(self.store)


class TokenMiddleware:
    """Refuses (401) every HTTP request that does not carry the token."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app, self.token = app, token

    def _given(self, request: Request) -> tuple[str | None, bool]:
        if q := request.query_params.get("token"):
            return q, True
        if c := request.cookies.get(COOKIE):
            return c, False
        auth = request.headers.get("authorization", "")
        return (auth[7:].strip(), False) if auth.lower().startswith("bearer ") else (None, False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        given, from_query = self._given(request)
        if not given or not hmac.compare_digest(given.encode(), self.token.encode()):
            await PlainTextResponse("401: this stoker ui needs its token: open the URL `stoker ui` printed "
                                    "(…/?token=…) or send `Authorization: Bearer <token>`", 401)(scope, receive, send)
            return
        if not from_query:
            await self.app(scope, receive, send)
            return

        async def send_with_cookie(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"set-cookie", f"{COOKIE}={self.token}; Path=/; HttpOnly; SameSite=Strict".encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_cookie)


def create_app(*, store: BlobStore, db: MetadataDB, home: Path | None = None, token: str | None = None,
               allowed_hosts: list[str] | None = None) -> Starlette:
    """The app over this store and index. ``allowed_hosts`` (the Host header's name) guards a loopback UI
    against DNS rebinding; ``token`` (required when it is not on loopback) guards everything."""
    from stoker.store.paths import home_dir

    middleware = []
    if allowed_hosts:
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts))
    if token:
        middleware.append(Middleware(TokenMiddleware, token=token))
    app = Starlette(routes=[*pages.routes, *api.routes, Mount("/static", StaticFiles(directory=STATIC), name="static")],
                    middleware=middleware)
    app.state.ui = UIState(store=store, db=db, home=Path(home) if home else home_dir())
    return app
