"""`stoker reindex`: rebuild the metadata index (``$STOKER_HOME/metadata.db``) from the blob store.

The store is the truth and the database only an index of it: every run's record (``run.json``) and every task
attempt's manifest are in the store. A damaged index (``database disk image is malformed``, ``file is not a
database``) is moved aside to ``metadata.db.damaged-TIME`` and a new one is built from the store. A sound index is
rebuilt only with ``--force``: tag changes made after a run started (``tag add``, ``Run.add_tag``) are kept in the
index alone and are lost with it.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import time
from pathlib import Path

from stoker.errors import ConfigError, StoreError


def index_problem(path: Path) -> str | None:
    """What SQLite finds wrong with the index at ``path`` (``PRAGMA quick_check``); None when it is sound or
    absent."""
    if not path.exists():
        return None
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows = con.execute("PRAGMA quick_check").fetchall()
        finally:
            con.close()
    except sqlite3.DatabaseError as e:
        return str(e)
    return None if rows == [("ok",)] else "; ".join(str(r[0]) for r in rows[:3])


def runs_in_store(store) -> list[tuple[str, str]]:
    """(flow, run id) of every run that wrote something to the store (``runs/FLOW/RUN/...``)."""
    found = set()
    for name in store.list("runs/"):
        parts = name.split("/")
        if len(parts) >= 4 and parts[1] and parts[2]:
            found.add((parts[1], parts[2]))
    return sorted(found)


def cmd_reindex(args: argparse.Namespace) -> int:
    from stoker.store.blobs import open_store
    from stoker.store.metadata import MetadataDB
    from stoker.store.paths import default_db_path

    path = default_db_path()
    problem = index_problem(path)
    if path.exists() and problem is None and not args.force:
        raise ConfigError(f"the index {path} is sound (PRAGMA quick_check: ok); nothing to repair. To rebuild it "
                          "anyway pass --force (tag changes made after a run started are lost)")
    store = open_store()
    kept = None
    if path.exists():
        kept = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
        for suffix in ("", "-wal", "-shm"):
            part = Path(f"{path}{suffix}")
            if part.exists():
                part.rename(f"{kept}{suffix}")
    runs = runs_in_store(store)
    manifests = 0
    refused: list[str] = []
    with MetadataDB(path) as db:
        for flow, run_id in runs:
            try:  # read and verified whole before it is written: a refused run leaves nothing in the index
                manifests += db.ingest_run_from_store(store, flow, run_id)
            except StoreError as e:  # one run that fails verification costs only that run
                refused.append(f"  {flow}/{run_id}: {e}")
    print(f"reindexed {len(runs) - len(refused)} run(s), {manifests} task attempt(s) from {store.url} into {path}"
          + (f"; the {'damaged' if problem else 'former'} index is kept at {kept}" if kept else ""))
    if refused:
        print(f"error: {len(refused)} run(s) not indexed, their records failed verification (restore them from a "
              f"backup, or delete runs/FLOW/RUN/ from the store to drop them):\n" + "\n".join(refused),
              file=sys.stderr)
        return 1
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("reindex", help="rebuild a damaged metadata index ($STOKER_HOME/metadata.db) from the store")
    p.add_argument("--force", action="store_true", help="rebuild a sound index too (tag changes made after a run "
                   "started are lost)")
    p.set_defaults(fn=cmd_reindex)
