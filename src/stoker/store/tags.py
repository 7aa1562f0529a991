"""Which tags a user may give a run, and which names may appear in a tag.

Every run carries system tags that stoker sets: ``user:NAME`` (the run's namespace, see
:mod:`stoker.client.namespaces`) and, for a ``@project`` flow, ``project:NAME`` and ``project_branch:BRANCH``. A
user tag with one of those prefixes (``--tag user:mallory``) would put the run in another user's namespace or
project, so it is refused; so are tags and user names holding a line break or another control character, which
would split a line of ``stoker runs``, ``tag list`` or a log.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable

from stoker.errors import ConfigError

USER_TAG = "user:"
SYSTEM_TAG_PREFIXES = (USER_TAG, "project:", "project_branch:")  # flow/project.py's PROJECT_TAG, BRANCH_TAG


def control_character(text: str) -> str | None:
    """The first control character of ``text`` (a line break, a tab, an escape, ...), as ``repr`` shows it; None
    when there is none."""
    for ch in text:
        if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp"):  # controls, format chars, line/para separators
            return repr(ch)
    return None


def check_user_tags(tags: Iterable[str], *, user: str | None = None, system: Iterable[str] = (),
                    where: str = "--tag") -> list[str]:
    """``tags`` as given, or a ConfigError naming the first one that is refused: a control character in it, or a
    system tag's prefix (``user:``, ``project:``, ``project_branch:``). A tag equal to one of ``system`` (the run's
    own system tags) or to ``user:<user>`` is let through: it names what the run already carries."""
    own = set(system) | ({f"{USER_TAG}{user}"} if user else set())
    out = []
    for tag in tags:
        if isinstance(tag, str):
            bad = control_character(tag)
            if bad:
                raise ConfigError(f"{where} {tag!r}: a tag may not hold a control character ({bad}); give it on "
                                  "one line, without tabs or escapes")
            prefix = next((p for p in SYSTEM_TAG_PREFIXES if tag.startswith(p)), None)
            if prefix and tag not in own:
                raise ConfigError(f"{where} {tag!r}: tags starting with {prefix!r} are system tags that stoker sets "
                                  f"(reserved: {', '.join(SYSTEM_TAG_PREFIXES)}); pick another name, e.g. "
                                  f"{tag.replace(':', '-', 1)!r}")
        out.append(tag)
    return out


def check_user_name(name: str, var: str) -> str:
    """``name`` (read from ``$var``) if it can name a user in a ``user:NAME`` tag (not blank, no surrounding
    spaces, no control character); else a ConfigError naming the variable."""
    bad = control_character(name)
    if bad:
        raise ConfigError(f"${var}={name!r} holds a control character ({bad}); set it to a plain user name")
    if not name.strip() or name != name.strip():
        raise ConfigError(f"${var}={name!r}: a user name may not be blank or start or end with spaces; set it to "
                          "a plain user name")
    return name
