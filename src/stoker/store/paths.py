"""Default locations of the stoker home, the blob store and the metadata index, and the current user."""

from __future__ import annotations

import getpass
import os
from pathlib import Path

from stoker.store.tags import check_user_name


def home_dir() -> Path:
    """The stoker home: ``$STOKER_HOME`` or ``./.stoker``, resolved to an absolute path."""
    return Path(os.environ.get("STOKER_HOME") or ".stoker").expanduser().resolve()


def default_store_url() -> str:
    """The blob store's URL: ``$STOKER_STORE`` (a folder or ``s3://bucket/prefix``) or ``<home>/store``."""
    return os.environ.get("STOKER_STORE") or str(home_dir() / "store")


def default_db_path() -> Path:
    """The SQLite metadata index: ``<home>/metadata.db``."""
    return home_dir() / "metadata.db"


def default_cache_dir() -> Path:
    """Where blobs of a remote store are downloaded to (``<home>/cache``)."""
    return home_dir() / "cache"


USER_VARS = ("STOKER_USER", "METAFLOW_USER", "SUDO_USER", "USERNAME", "USER")


def current_user() -> str:
    """The user name runs are tagged with: the first of ``$STOKER_USER``, ``$METAFLOW_USER``, ``$SUDO_USER``,
    ``$USERNAME``, ``$USER`` that is set and not ``root`` (Metaflow's order, stoker's own variable first), else
    ``root`` when one says so, else the login name. A name with a control character (a line break ...) or blank
    is refused, naming the variable it came from."""
    values = [(var, v) for var, v in ((var, os.environ.get(var)) for var in USER_VARS) if v]
    named = [(var, v) for var, v in values if v != "root"]
    if named or values:
        var, name = (named or values)[0]
        return check_user_name(name, var)
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry (containers)
        return "unknown"
