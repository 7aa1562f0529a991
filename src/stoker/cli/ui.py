"""`stoker ui [--host 127.0.0.1] [--port 8765] [--token T]`: the read-only web UI over the store and the index.

On loopback (the default) it needs no token (but takes one if given); bound to any other address every
request must carry a token, generated and printed once when not given."""

from __future__ import annotations

import argparse
import secrets
import socket

from stoker.cli.argtypes import port
from stoker.errors import ConfigError


def check_bind(host: str, port: int) -> None:
    """Refuse, before anything starts or a token is printed, an address that does not resolve or a port taken by
    another server; uvicorn would only log it after the URL was shown."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise ConfigError(f"--host {host}: not an address of this machine ({e}); use 127.0.0.1 (the default), "
                          f"0.0.0.0 for every interface, or one of this machine's addresses") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind(addr)
        except OSError as e:
            raise ConfigError(f"--host {host} --port {port}: cannot listen there ({e.strerror}); pick another "
                              f"--port, or stop what uses it (another `stoker ui`?)") from None


def cmd_ui(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from stoker.ui.app import LOOPBACK_NAMES, create_app, is_loopback
    except ImportError as e:
        raise ConfigError(f"stoker ui needs starlette and uvicorn ({e}): pip install 'stoker[ui]'") from None
    from stoker.store.blobs import open_store
    from stoker.store.metadata import MetadataDB
    from stoker.store.paths import default_db_path

    check_bind(args.host, args.port)
    token = args.token
    loopback = is_loopback(args.host)
    if not loopback and not token:
        token = secrets.token_urlsafe(24)
    shown_host = f"[{args.host}]" if ":" in args.host else args.host
    url = f"http://{shown_host}:{args.port}/" + (f"?token={token}" if token else "")
    app = create_app(store=open_store(), db=MetadataDB(default_db_path()), token=token,
                     allowed_hosts=[*LOOPBACK_NAMES, "[::1]"] if loopback else None)
    print(f"stoker ui: {url}" + ("" if loopback else "  (the token is printed only this once)"), flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ui", help="a web UI over the runs in the store (127.0.0.1 by default)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind; not loopback requires a token")
    p.add_argument("--port", type=port, default=8765, help="TCP port, 1-65535 (default 8765)")
    p.add_argument("--token", help="the token every request must carry (generated when --host is not loopback)")
    p.set_defaults(fn=cmd_ui)
