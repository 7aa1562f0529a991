"""Parts of the client shared by its objects: the base class, artifact views and task exceptions."""

from __future__ import annotations

import builtins
import os
import threading
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

from stoker.client.namespaces import NotFound, default_db, default_store
from stoker.errors import ConfigError, StoreError
from stoker.store.artifacts import load_artifact
from stoker.store.blobs import BlobStore, open_store
from stoker.store.metadata import MetadataDB
from stoker.store.paths import home_dir
from stoker.store.records import ArtifactRecord
from stoker.store.tags import check_user_tags

Task = Any  # a stoker.client.Task (not imported: client imports this module)

_MISSING = object()
_home: Path | None = None  # set by metadata(): the stoker home the client reads instead of the default one
_lock = threading.Lock()
_dbs: dict[tuple[Path, int], MetadataDB] = {}  # (path, pid) -> its connection


class Metadata(NamedTuple):
    """One metadata event of a task (Metaflow's ``Metadata``): ``created_at`` is epoch milliseconds."""

    name: str
    value: Any
    created_at: int
    type: str
    task: Any


def client_db() -> MetadataDB:
    """The metadata index the client reads: the one chosen with :func:`metadata`, else the default one."""
    if _home is None:
        return default_db()
    key = (_home / "metadata.db", os.getpid())  # a forked task must not use its parent's SQLite connection
    with _lock:
        if key not in _dbs:
            _dbs[key] = MetadataDB(key[0])
        return _dbs[key]


def _db_at(path: str) -> MetadataDB:
    """The index at ``path`` (one connection per process), the client's own when it is that one or is gone."""
    own = client_db()
    if not path or Path(path) == own.path or not Path(path).exists():
        return own
    key = (Path(path), os.getpid())
    with _lock:
        if key not in _dbs:
            _dbs[key] = MetadataDB(key[0])
        return _dbs[key]


def _reconnect(cls: type, pathspec: str, attempt: int | None, db_path: str, store_url: str | None) -> Any:
    """A pickled client object again (ClientObject.__reduce__), without a second namespace check (as Metaflow's,
    it was checked when it was made)."""
    kw: dict[str, Any] = {"db": _db_at(db_path), "_namespace_check": False}
    if store_url:
        try:
            kw["store"] = open_store(store_url)
        except Exception:  # noqa: BLE001 - a store this process cannot open: the client's own, when read
            pass
    if attempt is not None:
        kw["attempt"] = attempt
    return cls(pathspec, **kw)


def client_store() -> BlobStore:
    """The blob store the client reads: ``<home>/store`` of the home chosen with :func:`metadata` (unless
    ``$STOKER_STORE`` names one), else the default store."""
    if _home is None or os.environ.get("STOKER_STORE"):
        return default_store()
    return open_store(str(_home / "store"))


def get_metadata() -> str:
    """Where the client reads runs from, as Metaflow writes it: ``local@<stoker home>``."""
    return f"local@{_home if _home is not None else home_dir()}"


def metadata(ms: str) -> str:
    """Read runs from another stoker home: ``metadata("local@/path/home")`` or ``metadata("/path/home")`` (a
    folder holding a ``metadata.db``). Global, like Metaflow's; returns :func:`get_metadata`."""
    global _home
    kind, at, info = str(ms).partition("@")
    if not at:
        kind, info = ("service" if ms.startswith("http") else "local"), ms
    if kind != "local":
        raise ConfigError(f"metadata({ms!r}): stoker keeps its metadata in a local index only; pass "
                          f"'local@<stoker home>' or a folder holding a metadata.db")
    path = Path(info).expanduser().resolve()
    if not (path / "metadata.db").is_file():
        raise StoreError(f"metadata({ms!r}): {path} holds no metadata.db; give a stoker home (a folder where "
                         f"runs were made, i.e. a STOKER_HOME)")
    _home = path
    return get_metadata()


def default_metadata() -> str:
    """Read runs from the default stoker home again (``$STOKER_HOME`` or ``./.stoker``); returns
    :func:`get_metadata`."""
    global _home
    _home = None
    return get_metadata()


def dt_or_none(ts: float | None) -> datetime | None:
    """Epoch seconds as a naive local datetime (as Metaflow's client returns), None as None."""
    return None if ts is None else datetime.fromtimestamp(ts)


def split_pathspec(pathspec: str, n: int, what: str) -> list[str]:
    """Split ``Flow/run/...`` into exactly ``n`` non-empty parts, or raise NotFound saying the form."""
    parts = str(pathspec).strip("/").split("/")
    if len(parts) != n or not all(parts):
        example = "/".join(["Flow", "run_id", "step", "task_id", "name"][:n])
        raise NotFound(f"{what} pathspec {pathspec!r} must look like {example!r}")
    return parts


class ClientObject:
    """Common parts: pathspec, id, the db/store pair shared with children, equality by pathspec."""

    def __init__(self, pathspec: str, db: MetadataDB | None, store: BlobStore | None) -> None:
        self.pathspec = pathspec
        self.id = pathspec.rsplit("/", 1)[-1]
        self._db = db if db is not None else client_db()
        self._store_obj = store

    @property
    def _store(self) -> BlobStore:
        if self._store_obj is None:
            self._store_obj = client_store()
        return self._store_obj

    def _run_tags(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(user tags, system tags) of the run this object belongs to (none for a flow)."""
        parts = self.pathspec.split("/")
        rec = self._db.get_run(parts[0], parts[1]) if len(parts) > 1 else None
        return (rec.user_tags, rec.system_tags) if rec is not None else ((), ())

    @property
    def tags(self) -> frozenset[str]:
        """User and system tags of the run this object belongs to (a Flow has none, as in Metaflow)."""
        user, system = self._run_tags()
        return frozenset(user + system)

    @property
    def user_tags(self) -> frozenset[str]:
        return frozenset(self._run_tags()[0])

    @property
    def system_tags(self) -> frozenset[str]:
        return frozenset(self._run_tags()[1])

    @property
    def path_components(self) -> list[str]:
        """The pathspec split on '/'."""
        return self.pathspec.split("/")

    def _kw(self) -> dict[str, Any]:
        return {"db": self._db, "store": self._store_obj, "_namespace_check": False}

    def __repr__(self) -> str:
        return f"{type(self).__name__}('{self.pathspec}')"

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled (e.g. stored as an artifact) as what identifies it, as Metaflow's client objects are: its class,
        pathspec, the attempt asked for, and where its index and store were; it reconnects when unpickled."""
        task = getattr(self, "_task", self)  # an artifact: its task's attempt
        store = self._store_obj.url if self._store_obj is not None else None
        return (_reconnect, (type(self), self.pathspec, getattr(task, "_asked_attempt", None),
                             str(self._db.path), store))

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.pathspec == self.pathspec  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.pathspec))


class TagMutations:
    """Run's tag changes, as Metaflow's (``add_tag`` and friends, all through :meth:`replace_tags`)."""

    _db: MetadataDB
    flow_name: str
    id: str
    status: str

    def add_tag(self, tag: str | Iterable[str]) -> None:
        """Add a user tag (a tag that is already a system tag is not added, and that is no error)."""
        self.replace_tags([], [tag] if isinstance(tag, (str, bytes)) else tag)

    def add_tags(self, tags: Iterable[str]) -> None:
        """Add user tags (see :meth:`add_tag`); a string is one tag, as in Metaflow."""
        self.replace_tag([], tags)

    def remove_tag(self, tag: str | Iterable[str]) -> None:
        """Remove a user tag: removing a system tag is an error, removing a missing tag is a no-op."""
        self.replace_tags([tag] if isinstance(tag, (str, bytes)) else tag, [])

    def remove_tags(self, tags: Iterable[str]) -> None:
        """Remove user tags (see :meth:`remove_tag`)."""
        self.replace_tags(tags, [])

    def replace_tag(self, tag_to_remove: str | Iterable[str], tag_to_add: str | Iterable[str]) -> None:
        """Remove a tag and add one atomically, the removal first."""
        self.replace_tags([tag_to_remove] if isinstance(tag_to_remove, (str, bytes)) else tag_to_remove,
                          [tag_to_add] if isinstance(tag_to_add, (str, bytes)) else tag_to_add)

    def replace_tags(self, tags_to_remove: Iterable[str], tags_to_add: Iterable[str]) -> None:
        """Remove and add user tags atomically, the removals first, with Metaflow's rules (at least one tag,
        each a non-empty string of at most 500 characters, at most 50 user tags, no system tag removed)."""
        for name, arg in (("tags_to_add", tags_to_add), ("tags_to_remove", tags_to_remove)):
            if isinstance(arg, (str, bytes)):
                raise StoreError(f"{name} may not be a string: pass a list of tags")
            if not isinstance(arg, Iterable):
                raise StoreError(f"{name} must be iterable (a list of tags)")
        remove, add = list(tags_to_remove or []), list(tags_to_add or [])
        if not remove and not add:
            raise StoreError("Must add or remove at least one tag")
        if add:  # no system tag's prefix (user:, project:, ...), no control character; the run's own: a no-op
            rec = self._db.get_run(self.flow_name, self.id)
            check_user_tags(add, system=rec.system_tags if rec is not None else (), where="tag")
        final = self._db.mutate_tags(self.flow_name, self.id, remove=remove, add=add)  # one transaction
        self._user_tags = tuple(sorted(final))  # this object's tags: what its own change left, as Metaflow's
        self.status  # noqa: B018 - refresh the record


class TaskException:
    """The exception an attempt raised, with the fields of Metaflow's ``MetaflowExceptionWrapper``: ``type``
    (``module.Class``, e.g. ``builtins.ValueError``), ``exception`` (the message, also ``message``) and
    ``stacktrace`` (the traceback text, also ``traceback``); ``str()`` is the stacktrace, as in Metaflow. stoker adds
    why the attempt failed: ``cause`` (user, config, oom, node, network, preemption, time_limit, data, stoker,
    cancelled; None for an attempt recorded before causes were) and ``evidence`` (one line; docs/operations.md)."""

    def __init__(self, type: str, message: str, traceback: str, cause: str | None = None,
                 evidence: str | None = None) -> None:
        if type and "." not in type and isinstance(getattr(builtins, type, None), builtins.type):
            type = f"builtins.{type}"
        self.type, self.message, self.traceback = type, message, traceback
        self.cause, self.evidence = cause, evidence

    @property
    def exception(self) -> str:
        return self.message

    @property
    def stacktrace(self) -> str:
        return self.traceback

    def __str__(self) -> str:
        return self.traceback or f"[no stacktrace]\n{self.type}: {self.message}"

    def __repr__(self) -> str:
        return f"TaskException({self.type!r}, {self.message!r})"


class TaskData:
    """A task's artifacts as attributes; ``name in data`` tests for one."""

    def __init__(self, artifacts: dict[str, ArtifactBase], pathspec: str, values: bool = True) -> None:
        self._artifacts = artifacts
        self._pathspec = pathspec
        self._values = values

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_artifacts", "_pathspec", "_values"):
            raise AttributeError(name)
        art = self._artifacts.get(name)
        if art is None:
            raise AttributeError(f"task {self._pathspec} has no artifact {name!r}; it has "
                                 f"{sorted(self._artifacts)}")
        return art.data if self._values else art

    def __contains__(self, name: str) -> bool:
        return name in self._artifacts

    def __iter__(self) -> Iterator[ArtifactBase]:
        return iter(list(self._artifacts.values()))

    def __dir__(self) -> list[str]:
        return sorted(self._artifacts)

    def __repr__(self) -> str:
        return f"<data of {self._pathspec}: {', '.join(sorted(self._artifacts))}>"


class ArtifactBase(ClientObject):
    """One artifact of a task: ``.data`` (loaded on first access, then cached), ``.sha``, ``.size``.
    (client.DataArtifact adds the constructor from a pathspec, which needs client.Task.)"""

    @classmethod
    def _from(cls, task: Task, rec: ArtifactRecord) -> ArtifactBase:
        self = cls.__new__(cls)
        self._init(task, rec)
        return self

    def _init(self, task: Task, rec: ArtifactRecord) -> None:
        ClientObject.__init__(self, f"{task.pathspec}/{rec.name}", task._db, task._store_obj)
        self._task = task
        self._rec = rec
        self._value: Any = _MISSING

    @property
    def data(self) -> Any:
        """The artifact's value, loaded from the blob store on first access."""
        if self._value is _MISSING:
            from stoker.store.manifest import artifact_descriptor  # the signed manifest's, not the index's

            t = self._task
            desc = artifact_descriptor(t._store, t.flow_name, t.run_id, t.step_name, t.id, t.current_attempt,
                                       self._rec.name)
            self._value = load_artifact(t._store, desc, name=self._rec.name, pathspec=t.pathspec)
        return self._value

    @property
    def sha(self) -> str | None:
        return self._rec.sha

    @property
    def size(self) -> int | None:
        """Bytes of the serialized value (before compression)."""
        return self._rec.size

    @property
    def type(self) -> str | None:
        return self._rec.type

    @property
    def descriptor(self) -> dict[str, Any]:
        return dict(self._rec.descriptor)

    @property
    def finished_at(self) -> datetime | None:
        return self._task.finished_at

    @property
    def parent(self) -> Task:
        return self._task
