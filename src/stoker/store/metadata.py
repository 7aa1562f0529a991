"""The metadata index: flows, runs, steps, tasks, attempts, artifacts and tags in SQLite.

The blob store is the truth; this database is an index of it, built by the scheduler (its single
writer) from run records and task manifests. Readers (the client, the CLI, other processes) read
concurrently thanks to WAL. Every write is one ``BEGIN IMMEDIATE`` transaction; ingesting the same
manifest twice leaves the same rows.

WAL keeps its index in shared memory, which hosts sharing a network filesystem do not share: there the
database uses a rollback journal (``journal_mode=DELETE``, POSIX locks), where readers wait out a
commit (the busy timeout) instead of reading alongside it. ``STOKER_SQLITE_JOURNAL`` overrides the
choice.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from stoker.errors import ConfigError, StoreError
from stoker.store.fsinfo import MOUNTS_FILE, filesystem_type, is_network_fs
from stoker.store.manifest import StoredManifest, list_manifests, validate_manifest
from stoker.store.records import (
    MAX_USER_TAG_SET_SIZE,
    RUN_STATUSES,
    ArtifactRecord,
    AttemptRecord,
    RunRecord,
    StepRecord,
    TaskRecord,
    check_tag,
    natural_key,
)

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1

JOURNAL_ENV = "STOKER_SQLITE_JOURNAL"
JOURNAL_MODES = ("wal", "delete", "truncate")
_BUSY_TIMEOUT_S = 30.0
_fallback_logged: set[Path] = set()  # databases whose rollback-journal fallback was already logged

_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS flows (name TEXT PRIMARY KEY, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    flow TEXT NOT NULL, run_id TEXT NOT NULL, user TEXT, status TEXT NOT NULL,
    created_at REAL NOT NULL, finished_at REAL, params TEXT NOT NULL DEFAULT '{}', config TEXT,
    origin_run_id TEXT, PRIMARY KEY (flow, run_id));
CREATE INDEX IF NOT EXISTS runs_by_time ON runs (flow, created_at);
CREATE TABLE IF NOT EXISTS steps (
    flow TEXT NOT NULL, run_id TEXT NOT NULL, step TEXT NOT NULL, created_at REAL NOT NULL,
    PRIMARY KEY (flow, run_id, step));
CREATE TABLE IF NOT EXISTS tasks (
    flow TEXT NOT NULL, run_id TEXT NOT NULL, step TEXT NOT NULL, task_id TEXT NOT NULL,
    attempt INTEGER NOT NULL, status TEXT NOT NULL, started_at REAL, finished_at REAL,
    foreach_index TEXT NOT NULL DEFAULT '[]', PRIMARY KEY (flow, run_id, step, task_id));
CREATE TABLE IF NOT EXISTS attempts (
    flow TEXT NOT NULL, run_id TEXT NOT NULL, step TEXT NOT NULL, task_id TEXT NOT NULL,
    attempt INTEGER NOT NULL, status TEXT NOT NULL, started_at REAL, finished_at REAL, user TEXT,
    hostname TEXT, foreach_stack TEXT NOT NULL DEFAULT '[]', manifest TEXT,
    PRIMARY KEY (flow, run_id, step, task_id, attempt));
CREATE TABLE IF NOT EXISTS artifacts (
    flow TEXT NOT NULL, run_id TEXT NOT NULL, step TEXT NOT NULL, task_id TEXT NOT NULL,
    attempt INTEGER NOT NULL, name TEXT NOT NULL, kind TEXT, type TEXT, sha TEXT, size INTEGER,
    descriptor TEXT NOT NULL, PRIMARY KEY (flow, run_id, step, task_id, attempt, name));
CREATE INDEX IF NOT EXISTS artifacts_by_sha ON artifacts (sha);
CREATE TABLE IF NOT EXISTS tags (
    flow TEXT NOT NULL, run_id TEXT NOT NULL, tag TEXT NOT NULL, system INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (flow, run_id, tag));
"""

_TASK_COLS = "flow, run_id, step, task_id, attempt, status, started_at, finished_at, foreach_index"
_ATTEMPT_COLS = "flow, run_id, step, task_id, attempt, status, started_at, finished_at, user, hostname, manifest"


_dumps = json.JSONEncoder(sort_keys=True, default=str).encode  # json.dumps with these builds an encoder per call


def _foreach_index(stack: str | list | None) -> str:
    """The tasks table's foreach_index column from an attempt's foreach stack (its column's JSON, or the list):
    the split indexes."""
    frames = json.loads(stack or "[]") if isinstance(stack, str) or stack is None else stack
    return _dumps([int(f["index"]) if isinstance(f, dict) and f.get("index") is not None else -1 for f in frames])


def _checked_manifest(m: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """A manifest to index, normalized, and the JSON text it was stored as when known (a StoredManifest, which a
    local member handed over as it wrote it): the attempts row then takes the text as it is."""
    if isinstance(m, StoredManifest) and m.text:  # a local member's, handed over: validated when it was written
        return m, m.text
    out = validate_manifest(m)
    return out, None


def _journal_from_env() -> str | None:
    """The journal mode ``$STOKER_SQLITE_JOURNAL`` asks for, or None when it is unset or empty."""
    value = os.environ.get(JOURNAL_ENV, "").strip()
    if not value:
        return None
    if value.lower() not in JOURNAL_MODES:
        raise ConfigError(f"{JOURNAL_ENV}={value!r} is not a journal mode: use one of {', '.join(JOURNAL_MODES)}, "
                          f"or unset it to pick by filesystem (wal locally, delete on network filesystems)")
    return value.lower()


def index_fix(path: Path, e: BaseException) -> str:
    """What to do about a failed open, read or write of the index at ``path``: rebuild a damaged one, free space
    on a full disk, wait for a lock; the writable-folder hint only where the system refused access."""
    msg = str(e).lower()
    code = (getattr(e, "sqlite_errorcode", None) or -1) & 0xFF  # the primary code of an extended one
    errno_ = getattr(e, "errno", None)
    if code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB) or "malformed" in msg or "not a database" in msg:
        return ("the index is damaged (corrupt); it only indexes the store, so rebuild it from the store with "
                "`stoker reindex` (the damaged file is kept beside it)")
    if code == sqlite3.SQLITE_FULL or "disk is full" in msg or "disk full" in msg or errno_ == 28:  # ENOSPC
        return f"free space on the file system of {path.parent} and retry"
    if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or "locked" in msg or "busy" in msg:
        return (f"another process holds it locked for longer than {_BUSY_TIMEOUT_S:.0f} s (the scheduler is "
                f"its only writer: is another stoker run using this STOKER_HOME?); retry when it is done")
    if code in (sqlite3.SQLITE_PERM, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_AUTH) \
            or isinstance(e, PermissionError) or "readonly" in msg or "unable to open" in msg:
        return "check that the file and its folder are writable (set STOKER_HOME to a writable folder)"
    return f"check the file system of {path.parent} (the message above is the system's)"


class MetadataDB:
    """The SQLite metadata index at ``path`` (created if missing). Thread-safe.

    The journal mode is WAL on a local filesystem and ``delete`` (a rollback journal) on a network
    one, unless ``$STOKER_SQLITE_JOURNAL`` (wal, delete or truncate) says otherwise; ``journal_mode``
    is the mode SQLite reports in effect. ``mounts_file`` is the mount table the filesystem is looked
    up in (tests pass a recorded one).
    """

    def __init__(self, path: str | Path, *, mounts_file: str | Path = MOUNTS_FILE) -> None:
        self.path = Path(path).expanduser().resolve()
        wanted = _journal_from_env()  # a bad value fails before anything is created
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if wanted is None:
                wanted = "delete" if is_network_fs(self.path, mounts_file) else "wal"
                if wanted == "delete" and self.path not in _fallback_logged:
                    _fallback_logged.add(self.path)
                    log.info("%s is on a network filesystem (%s), where SQLite's WAL mode is unsafe: using a "
                             "rollback journal (journal_mode=DELETE); set %s to override",
                             self.path, filesystem_type(self.path, mounts_file), JOURNAL_ENV)
            self._conn = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_S, isolation_level=None,
                                         check_same_thread=False)
            self._conn.execute(f"PRAGMA busy_timeout = {int(_BUSY_TIMEOUT_S * 1000)}")
            with contextlib.suppress(sqlite3.OperationalError):
                # Leaving WAL needs the only connection: with another one open this fails ("database is
                # locked") and the database keeps its mode, hence the read back.
                self._conn.execute(f"PRAGMA journal_mode = {wanted.upper()}")
            self.journal_mode: str = self._conn.execute("PRAGMA journal_mode").fetchone()[0].lower()
            # NORMAL is safe with WAL (a power loss may drop the last commits); a rollback journal needs FULL.
            self._conn.execute(f"PRAGMA synchronous = {'NORMAL' if self.journal_mode == 'wal' else 'FULL'}")
        except (OSError, sqlite3.Error) as e:
            raise StoreError(f"cannot open the metadata database {self.path}: {e}; {index_fix(self.path, e)}") from e
        if self.journal_mode != wanted:
            log.warning("%s stays in journal mode %s instead of %s: another process has it open; it switches "
                        "when opened while no other connection is", self.path, self.journal_mode, wanted)
        self._lock = threading.RLock()
        self._init_schema()

    def _init_schema(self) -> None:
        with self._lock:
            try:
                self._conn.executescript(_SCHEMA)  # idempotent; executescript commits on its own
            except sqlite3.Error as e:
                raise StoreError(f"cannot create the tables of {self.path}: {e}; {index_fix(self.path, e)}") from e
        with self._tx() as c:
            row = c.execute("SELECT version FROM schema_version").fetchone()
            if row is None:
                c.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION,))
            elif row[0] > SCHEMA_VERSION:
                raise StoreError(f"{self.path} has schema version {row[0]}, newer than this stoker's "
                                 f"({SCHEMA_VERSION}): upgrade stoker")

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> MetadataDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MetadataDB({str(self.path)!r})"

    def _write_error(self, e: sqlite3.Error) -> StoreError:
        """A StoreError for a failed write to the database: what failed and how to fix it."""
        return StoreError(f"cannot write the metadata database {self.path}: {e}; nothing was written: "
                          f"{index_fix(self.path, e)}")

    def _rollback(self) -> None:
        """End the open transaction, if any (SQLite may already have rolled it back itself)."""
        if self._conn.in_transaction:
            try:
                self._conn.execute("ROLLBACK")
            except sqlite3.Error as e:  # the original error matters more
                log.warning("rolling back a failed write to %s failed too: %s", self.path, e)

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction: committed if the body returns, rolled back if it raises.
        A failed COMMIT (disk full, a lock held too long) is rolled back too, so the connection is never
        left inside a transaction, and every SQLite error comes out as a StoreError naming the fix."""
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as e:
                self._rollback()
                raise self._write_error(e) from e
            try:
                yield self._conn
            except sqlite3.Error as e:
                self._rollback()
                raise self._write_error(e) from e
            except BaseException:
                self._rollback()
                raise
            try:
                self._conn.execute("COMMIT")
            except sqlite3.Error as e:
                # a failed COMMIT leaves the transaction open (SQLITE_BUSY) or half-ended: roll it back
                self._rollback()
                raise self._write_error(e) from e

    def _query(self, sql: str, args: Iterable[Any] = ()) -> list[tuple]:
        with self._lock:
            try:
                return self._conn.execute(sql, tuple(args)).fetchall()
            except sqlite3.Error as e:
                raise StoreError(f"cannot read the metadata database {self.path}: {e}; "
                                 f"{index_fix(self.path, e)}") from e

    # --- writes ------------------------------------------------------------------------------------
    def create_run(self, flow: str, run_id: str, *, user: str, tags: Iterable[str] = (),
                   params: dict[str, Any], config: dict[str, Any] | None = None,
                   origin_run_id: str | None = None, system_tags: Iterable[str] = (),
                   created_at: float | None = None) -> RunRecord:
        """Register a new run (status ``running``) tagged ``user:<user>`` plus ``tags``."""
        now = time.time() if created_at is None else created_at
        with self._tx() as c:
            if c.execute("SELECT 1 FROM runs WHERE flow=? AND run_id=?", (flow, run_id)).fetchone():
                raise StoreError(f"run {flow}/{run_id} already exists in {self.path}; pick a new run id")
            c.execute("INSERT OR IGNORE INTO flows VALUES (?, ?)", (flow, now))
            c.execute("INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?)",
                      (flow, run_id, user, "running", now, None, _dumps(params),
                       None if config is None else _dumps(config), origin_run_id))
            self._insert_tags(c, flow, run_id, [f"user:{user}", *system_tags], system=True)
            self._insert_tags(c, flow, run_id, tags, system=False)
        run = self.get_run(flow, run_id)
        assert run is not None
        return run

    @staticmethod
    def _insert_tags(c: sqlite3.Connection, flow: str, run_id: str, tags: Iterable[str], system: bool) -> None:
        for tag in tags:
            c.execute("INSERT INTO tags VALUES (?,?,?,?) ON CONFLICT DO UPDATE SET system=max(system, ?)",
                      (flow, run_id, check_tag(tag), int(system), int(system)))

    def set_run_status(self, flow: str, run_id: str, status: str, *, finished_at: float | None = None) -> None:
        """Set a run's status (running/succeeded/failed/killed); a final status stamps ``finished_at``."""
        if status not in RUN_STATUSES:
            raise StoreError(f"run status {status!r} is not one of {RUN_STATUSES}")
        if status != "running" and finished_at is None:
            finished_at = time.time()
        with self._tx() as c:
            cur = c.execute("UPDATE runs SET status=?, finished_at=? WHERE flow=? AND run_id=?",
                            (status, finished_at, flow, run_id))
            if cur.rowcount == 0:
                raise StoreError(f"run {flow}/{run_id} is not in {self.path}; create_run it first")

    def add_tags(self, flow: str, run_id: str, tags: Iterable[str]) -> None:
        """Add user tags to a run."""
        with self._tx() as c:
            self._require_run(c, flow, run_id)
            self._insert_tags(c, flow, run_id, tags, system=False)

    def remove_tags(self, flow: str, run_id: str, tags: Iterable[str]) -> None:
        """Remove user tags from a run (system tags such as ``user:<name>`` cannot be removed)."""
        with self._tx() as c:
            self._require_run(c, flow, run_id)
            for tag in tags:
                row = c.execute("SELECT system FROM tags WHERE flow=? AND run_id=? AND tag=?",
                                (flow, run_id, tag)).fetchone()
                if row and row[0]:
                    raise StoreError(f"{tag!r} is a system tag of run {flow}/{run_id} and cannot be removed")
                c.execute("DELETE FROM tags WHERE flow=? AND run_id=? AND tag=?", (flow, run_id, tag))

    def mutate_tags(self, flow: str, run_id: str, remove: Iterable[str] = (), add: Iterable[str] = ()) -> set[str]:
        """Remove then add user tags of a run in one transaction, with Metaflow's rules; return the user tags.

        Removing a system tag is an error, adding one changes nothing, removing a missing tag is a no-op, and
        a run may carry at most 50 user tags (a larger set may only shrink)."""
        remove, add = [check_tag(t) for t in remove], [check_tag(t) for t in add]
        with self._tx() as c:
            self._require_run(c, flow, run_id)
            rows = c.execute("SELECT tag, system FROM tags WHERE flow=? AND run_id=?", (flow, run_id)).fetchall()
            system = {t for t, s in rows if s}
            user = {t for t, s in rows if not s}
            if set(remove) & system:
                raise StoreError(f"Cannot remove a tag that is an existing system tag ({sorted(set(remove) & system)}) "
                                 f"of run {flow}/{run_id}: only user tags can be removed")
            final = (user - set(remove)) | (set(add) - system)
            if len(final) > MAX_USER_TAG_SET_SIZE and len(final) > len(user):
                raise StoreError(f"Cannot increase size of tag set beyond {MAX_USER_TAG_SET_SIZE} (run {flow}/{run_id} "
                                 f"would have {len(final)} user tags): remove some first")
            for tag in user - final:
                c.execute("DELETE FROM tags WHERE flow=? AND run_id=? AND tag=? AND system=0", (flow, run_id, tag))
            self._insert_tags(c, flow, run_id, sorted(final - user), system=False)
        return final

    @staticmethod
    def _require_run(c: sqlite3.Connection, flow: str, run_id: str) -> None:
        if not c.execute("SELECT 1 FROM runs WHERE flow=? AND run_id=?", (flow, run_id)).fetchone():
            raise StoreError(f"run {flow}/{run_id} does not exist")

    def register_attempt(self, flow: str, run_id: str, step: str, task_id: str, attempt: int, *,
                         started_at: float | None = None, user: str | None = None,
                         hostname: str | None = None, foreach_stack: list[dict] | None = None) -> None:
        """Record that an attempt started (status ``running``) so readers see live tasks; its manifest,
        when ingested, replaces this row. Registering an already finished attempt changes nothing."""
        self.write_batch([("register", dict(flow=flow, run_id=run_id, step=step, task_id=task_id, attempt=attempt,
                                            started_at=started_at, user=user, hostname=hostname,
                                            foreach_stack=foreach_stack))])

    def ingest_manifest(self, manifest: dict[str, Any]) -> None:
        """Index a task attempt's manifest (idempotent: ingesting it again changes nothing)."""
        self.write_batch([("ingest", manifest)])

    def write_batch(self, ops: list[tuple[str, Any]]) -> None:
        """Apply ``("register", register_attempt keyword arguments)`` and ``("ingest", manifest)`` operations in
        order, in ONE transaction: all of them or none (the scheduler indexes what one pass started and ended
        at once; a transaction costs more than the rows it writes)."""
        checked = [(kind, _checked_manifest(arg) if kind == "ingest" else arg) for kind, arg in ops]
        seen: dict[tuple, float] = {}  # (flow, run_id, step) whose rows this transaction made sure of -> earliest time
        with self._tx() as c:
            for kind, arg in checked:
                if kind == "ingest":
                    self._ingest(c, *arg, seen=seen)
                elif kind == "register":
                    self._register(c, **arg, seen=seen)
                else:
                    raise StoreError(f"unknown index operation {kind!r}: use 'register' or 'ingest'")

    @classmethod
    def _register(cls, c: sqlite3.Connection, flow: str, run_id: str, step: str, task_id: str, attempt: int, *,
                  started_at: float | None = None, user: str | None = None, hostname: str | None = None,
                  foreach_stack: list[dict] | None = None, seen: dict[tuple, float] | None = None) -> None:
        now = time.time() if started_at is None else started_at
        cls._ensure_parents(c, flow, run_id, step, user, now, seen)
        stack = _dumps(foreach_stack or [])
        c.execute("INSERT OR IGNORE INTO attempts VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                  (flow, run_id, step, task_id, int(attempt), "running", now, None, user, hostname, stack, None))
        # a task's first row (most of a run's) needs no look at its other attempts: there are none
        if not c.execute(f"INSERT OR IGNORE INTO tasks ({_TASK_COLS}) VALUES (?,?,?,?,?,?,?,?,?)",
                         (flow, run_id, step, task_id, int(attempt), "running", now, None,
                          _foreach_index(foreach_stack))).rowcount:
            cls._refresh_task(c, flow, run_id, step, task_id)

    @classmethod
    def _ingest(cls, c: sqlite3.Connection, m: dict[str, Any], text: str | None = None,
                seen: dict[tuple, float] | None = None) -> None:
        key = (m["flow"], m["run_id"], m["step"], m["task_id"], m["attempt"])
        cls._ensure_parents(c, m["flow"], m["run_id"], m["step"], m["user"], m["started_at"], seen)
        c.execute("INSERT OR REPLACE INTO attempts VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                  (*key, m["status"], m["started_at"], m["finished_at"], m["user"], m["hostname"],
                   _dumps(m["foreach_stack"]), text or _dumps(m)))
        c.execute("DELETE FROM artifacts WHERE flow=? AND run_id=? AND step=? AND task_id=? AND attempt=?", key)
        c.executemany("INSERT INTO artifacts VALUES (?,?,?,?,?,?,?,?,?,?,?)", [
            (*key, name, d.get("kind"), d.get("type"), d.get("sha"), d.get("size"), _dumps(d))
            for name, d in m["artifacts"].items()])
        cls._refresh_task(c, m["flow"], m["run_id"], m["step"], m["task_id"],
                          known=(m["attempt"], _foreach_index(m["foreach_stack"])))

    def ingest_run_from_store(self, store: Any, flow: str, run_id: str) -> int:
        """(Re)index a run from the blob store: its record (``run.json``, if written) and every
        manifest; return the number of manifests. Everything is read and verified before anything is written: a run
        with a record or manifest that fails verification (StoreError) leaves the index as it was."""
        from stoker.store.manifest import read_manifest, read_run_record

        record = read_run_record(store, flow, run_id)
        names = list_manifests(store, flow, run_id)
        manifests = [read_manifest(store, flow, run_id, *name.split("/")[3:5], int(name.split("/")[5]))
                     for name in names]
        if record is not None and self.get_run(flow, run_id) is None:
            self.create_run(flow, run_id, user=record["user"], tags=record.get("tags", ()),
                            params=record["params"], config=record.get("config"),
                            origin_run_id=record.get("origin_run_id"), created_at=record.get("created_at"),
                            system_tags=record.get("system_tags", ()))  # e.g. @project's
        if record is not None and record.get("status", "running") != "running":
            self.set_run_status(flow, run_id, record["status"], finished_at=record.get("finished_at"))
        for manifest in manifests:
            self.ingest_manifest(manifest)
        return len(names)

    @staticmethod
    def _ensure_parents(c: sqlite3.Connection, flow: str, run_id: str, step: str, user: str | None,
                        at: float, seen: dict[tuple, float] | None = None) -> None:
        """The flow, run and step rows exist. ``seen``: the steps this transaction made sure of already, with the
        earliest time written: a later one changes nothing (a wide foreach indexes hundreds of tasks at once)."""
        if seen is not None:
            key = (flow, run_id, step)
            if key in seen and at >= seen[key]:
                return
            seen[key] = min(at, seen.get(key, at))
        c.execute("INSERT OR IGNORE INTO flows VALUES (?, ?)", (flow, at))
        if c.execute("INSERT OR IGNORE INTO runs (flow, run_id, user, status, created_at) VALUES (?,?,?,?,?)",
                     (flow, run_id, user, "running", at)).rowcount and user:
            c.execute("INSERT OR IGNORE INTO tags VALUES (?,?,?,1)", (flow, run_id, f"user:{user}"))
        c.execute("INSERT INTO steps VALUES (?,?,?,?) ON CONFLICT DO UPDATE SET "
                  "created_at=min(created_at, excluded.created_at)", (flow, run_id, step, at))

    @staticmethod
    def _refresh_task(c: sqlite3.Connection, flow: str, run_id: str, step: str, task_id: str,
                      known: tuple[int, str] | None = None) -> None:
        """Make the task row reflect its latest attempt (attempts may be ingested out of order). ``known``: an
        attempt and its foreach_index, already at hand (not parsed again from the attempt's row)."""
        where = (flow, run_id, step, task_id)
        same = "flow=? AND run_id=? AND step=? AND task_id=?"
        attempt, status, finished_at, stack, started_at = c.execute(
            f"SELECT attempt, status, finished_at, foreach_stack, (SELECT min(started_at) FROM attempts WHERE {same}) "
            f"FROM attempts WHERE {same} ORDER BY attempt DESC LIMIT 1", where + where).fetchone()
        c.execute(f"INSERT OR REPLACE INTO tasks ({_TASK_COLS}) VALUES (?,?,?,?,?,?,?,?,?)",
                  (*where, attempt, status, started_at, finished_at,
                   known[1] if known and known[0] == attempt else _foreach_index(stack)))

    # --- reads -------------------------------------------------------------------------------------
    def list_flows(self) -> list[str]:
        """Names of all flows, sorted."""
        return [r[0] for r in self._query("SELECT name FROM flows ORDER BY name")]

    def has_flow(self, flow: str) -> bool:
        """Whether a flow has been recorded."""
        return bool(self._query("SELECT 1 FROM flows WHERE name=?", (flow,)))

    def _tags(self, flow: str, run_id: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        rows = self._query("SELECT tag, system FROM tags WHERE flow=? AND run_id=? ORDER BY tag", (flow, run_id))
        return tuple(t for t, s in rows if not s), tuple(t for t, s in rows if s)

    def _run(self, row: tuple) -> RunRecord:
        flow, run_id, user, status, created, finished, params, config, origin = row
        user_tags, system_tags = self._tags(flow, run_id)
        return RunRecord(flow=flow, run_id=run_id, user=user, status=status, created_at=created,
                         finished_at=finished, params=json.loads(params or "{}"),
                         config=None if config is None else json.loads(config), origin_run_id=origin,
                         user_tags=user_tags, system_tags=system_tags)

    def get_run(self, flow: str, run_id: str) -> RunRecord | None:
        """One run, or None."""
        rows = self._query("SELECT * FROM runs WHERE flow=? AND run_id=?", (flow, run_id))
        return self._run(rows[0]) if rows else None

    def list_runs(self, flow: str | None = None, *, tags: Iterable[str] = (), status: str | None = None,
                  limit: int | None = None) -> list[RunRecord]:
        """Runs (of ``flow``, or of all flows) carrying every tag in ``tags``, newest first."""
        sql, args = "SELECT * FROM runs r WHERE 1=1", []
        if flow is not None:
            sql += " AND flow=?"
            args.append(flow)
        if status is not None:
            sql += " AND status=?"
            args.append(status)
        for tag in tags:
            sql += " AND EXISTS (SELECT 1 FROM tags t WHERE t.flow=r.flow AND t.run_id=r.run_id AND t.tag=?)"
            args.append(tag)
        sql += " ORDER BY created_at DESC, rowid DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [self._run(r) for r in self._query(sql, args)]

    def latest_run(self, flow: str, *, tags: Iterable[str] = (), status: str | None = None) -> RunRecord | None:
        """The newest run of ``flow`` with these tags (and status), or None."""
        runs = self.list_runs(flow, tags=tags, status=status, limit=1)
        return runs[0] if runs else None

    def list_steps(self, flow: str, run_id: str) -> list[StepRecord]:
        """The steps of a run in the order they started, with task counts per status."""
        rows = self._query(
            "SELECT s.step, s.created_at, count(t.task_id), sum(t.status='ok'), sum(t.status='failed'), "
            "sum(t.status='running'), max(t.finished_at) FROM steps s LEFT JOIN tasks t ON t.flow=s.flow "
            "AND t.run_id=s.run_id AND t.step=s.step WHERE s.flow=? AND s.run_id=? GROUP BY s.step "
            "ORDER BY s.created_at, s.rowid", (flow, run_id))
        return [StepRecord(flow=flow, run_id=run_id, step=s, created_at=c, num_tasks=n, num_ok=ok or 0,
                           num_failed=bad or 0, num_running=run or 0, finished_at=fin)
                for s, c, n, ok, bad, run, fin in rows]

    def get_step(self, flow: str, run_id: str, step: str) -> StepRecord | None:
        """One step of a run, or None."""
        return next((s for s in self.list_steps(flow, run_id) if s.step == step), None)

    def list_tasks(self, flow: str, run_id: str, step: str | None = None) -> list[TaskRecord]:
        """Tasks of a run (or of one step), ordered by foreach index then task id."""
        sql, args = f"SELECT {_TASK_COLS} FROM tasks WHERE flow=? AND run_id=?", [flow, run_id]
        if step is not None:
            sql += " AND step=?"
            args.append(step)
        tasks = [TaskRecord.from_row(r) for r in self._query(sql, args)]
        return sorted(tasks, key=lambda t: (t.started_at or 0.0, t.foreach_index, natural_key(t.task_id))
                      if step is None else (t.foreach_index, natural_key(t.task_id)))

    def get_task(self, flow: str, run_id: str, step: str, task_id: str) -> TaskRecord | None:
        """One task (reflecting its latest attempt), or None."""
        rows = self._query(f"SELECT {_TASK_COLS} FROM tasks WHERE flow=? AND run_id=? AND step=? AND task_id=?",
                           (flow, run_id, step, task_id))
        return TaskRecord.from_row(rows[0]) if rows else None

    def list_attempts(self, flow: str, run_id: str, step: str, task_id: str) -> list[AttemptRecord]:
        """Every attempt of a task, oldest first."""
        rows = self._query(f"SELECT {_ATTEMPT_COLS} FROM attempts WHERE flow=? AND run_id=? AND step=? AND "
                           "task_id=? ORDER BY attempt", (flow, run_id, step, task_id))
        return [AttemptRecord.from_row(r) for r in rows]

    def get_attempt(self, flow: str, run_id: str, step: str, task_id: str,
                    attempt: int | None = None) -> AttemptRecord | None:
        """One attempt (the latest by default), or None."""
        attempts = self.list_attempts(flow, run_id, step, task_id)
        if attempt is None:
            return attempts[-1] if attempts else None
        return next((a for a in attempts if a.attempt == attempt), None)

    def list_artifacts(self, flow: str, run_id: str, step: str, task_id: str,
                       attempt: int | None = None) -> list[ArtifactRecord]:
        """The artifacts of a task's attempt (the latest by default), sorted by name."""
        if attempt is None:
            task = self.get_task(flow, run_id, step, task_id)
            if task is None:
                return []
            attempt = task.attempt
        rows = self._query("SELECT name, kind, type, sha, size, descriptor FROM artifacts WHERE flow=? AND "
                           "run_id=? AND step=? AND task_id=? AND attempt=? ORDER BY name",
                           (flow, run_id, step, task_id, attempt))
        return [ArtifactRecord(name=n, kind=k, type=t, sha=s, size=z, descriptor=json.loads(d))
                for n, k, t, s, z, d in rows]

    def get_artifact(self, flow: str, run_id: str, step: str, task_id: str, name: str,
                     attempt: int | None = None) -> ArtifactRecord | None:
        """One artifact of a task's attempt (the latest by default), or None."""
        return next((a for a in self.list_artifacts(flow, run_id, step, task_id, attempt) if a.name == name),
                    None)
