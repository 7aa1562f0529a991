"""The end of a run, recorded on the way out: in the store (``run.json``, the truth) and in the index.

Each write is tried whatever became of the other, and any failure (a full disk, a lost mount, a locked index)
is one StoreError that says how the run ended, what could not be written and how to go on: never a traceback,
never a silent ``running`` forever. When the record cannot be written the driver leaves an empty end marker
beside it (an empty file needs no data block, so a full disk still takes it); readers then show the run as
``lost`` (:mod:`stoker.store.runstate`), as they do when its driver process is gone.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from stoker.errors import StokerError, StoreError
from stoker.store.blobs import BlobStore
from stoker.store.manifest import run_record_name, write_run_record
from stoker.store.metadata import MetadataDB
from stoker.store.runstate import end_marker_name, resume_hint

log = logging.getLogger(__name__)


def _why(e: BaseException) -> str:
    """One line for a failed write: stoker's message (it names the file and the fix), or the OS error's."""
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}" + (f" ({e.filename})" if e.filename else "")
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _leave_marker(store: BlobStore, flow: str, run_id: str, status: str) -> bool:
    try:
        store.write(end_marker_name(flow, run_id, status), b"")
        return True
    except (StokerError, OSError) as e:  # the disk has no room even for a name: readers watch the driver's pid
        log.warning("could not leave the end marker of run %s/%s either: %s", flow, run_id, _why(e))
        return False


def record_end(store: BlobStore, db: MetadataDB, record: dict[str, Any], status: str) -> None:
    """Record that the run of ``record`` ended with ``status``, in the store and in the index; StoreError (after
    trying both) when either could not be written."""
    flow, run_id, now = record["flow"], record["run_id"], time.time()
    stored = indexed = True
    problems = []
    try:
        write_run_record(store, {**record, "status": status, "finished_at": now})
    except (StokerError, OSError) as e:
        stored = False
        problems.append(f"its record {run_record_name(flow, run_id)} in the store {store.url}: {_why(e)}")
        _leave_marker(store, flow, run_id, status)
    try:
        db.set_run_status(flow, run_id, status, finished_at=now)
    except (StokerError, OSError) as e:
        indexed = False
        problems.append(f"the index {db.path}: {_why(e)}")
    if stored and indexed:
        return
    in_flight = sys.exc_info()[1]  # called while the scheduler's own failure is handled: say what it was
    cause = f" ({type(in_flight).__name__}: {str(in_flight).splitlines()[0] if str(in_flight) else ''})" \
        if in_flight is not None and not isinstance(in_flight, KeyboardInterrupt) else ""
    if stored:  # readers take a finished record over the index's `running`
        after = f"The store has its end, so `stoker runs` shows it as {status}; free space for the index"
    elif indexed:
        after = f"The index has its end, so `stoker runs` shows it as {status}; free space (or fix the store)"
    else:
        after = (f"`stoker runs`, `stoker show` and the client show it as lost; free space (or fix the storage), "
                 f"then {resume_hint(record, run_id)}")
    raise StoreError(f"run {flow}/{run_id} {status}{cause}, but its end could not be recorded in "
                     + "; nor in ".join(problems) + f". {after}")
