"""Every URL component the UI turns into a store name passes through here: a strict pattern, so that no
request can name anything outside the store (no '..', no slashes or backslashes, no absolute paths)."""

from __future__ import annotations

import re

from starlette.exceptions import HTTPException

# Flow and step names are identifiers; run and task ids are digits or short words; card ids likewise.
_COMPONENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@+-]{0,127}$")
STREAMS = ("stdout", "stderr")
SERIES_KINDS = ("metrics", "monitor")


def component(value: str, what: str) -> str:
    """``value`` if it is one safe path component, else a 404 (a bad name names nothing that exists)."""
    if not isinstance(value, str) or not _COMPONENT.match(value) or ".." in value:
        raise HTTPException(404, f"no such {what}: {value!r}")
    return value


def attempt_no(value: str) -> int:
    if not value.isdigit() or len(value) > 6:
        raise HTTPException(404, f"no such attempt: {value!r}")
    return int(value)


def choice(value: str, allowed: tuple[str, ...], what: str) -> str:
    if value not in allowed:
        raise HTTPException(404, f"no such {what}: {value!r} (one of {', '.join(allowed)})")
    return value
