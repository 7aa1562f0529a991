"""Parts of the client shared by its objects: the base class, artifact views and task exceptions."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from stoker.store.artifacts import load_artifact
from stoker.store.blob import BlobStore
from stoker.store.metadata import MetadataDB
from stoker.store.namespaces import NotFound, default_db, default_store
from stoker.store.records import ArtifactRecord

if TYPE_CHECKING:
    from stoker.store.client import Task

_MISSING = object()


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
        self._db = db if db is not None else default_db()
        self._store_obj = store

    @property
    def _store(self) -> BlobStore:
        if self._store_obj is None:
            self._store_obj = default_store()
        return self._store_obj

    @property
    def path_components(self) -> list[str]:
        """The pathspec split on '/'."""
        return self.pathspec.split("/")

    def _kw(self) -> dict[str, Any]:
        return {"db": self._db, "store": self._store_obj, "_namespace_check": False}

    def __repr__(self) -> str:
        return f"{type(self).__name__}('{self.pathspec}')"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.pathspec == self.pathspec  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.pathspec))


class TaskException:
    """The exception an attempt raised: ``type``, ``message`` and ``traceback`` (text)."""

    def __init__(self, type: str, message: str, traceback: str) -> None:
        self.type, self.message, self.traceback = type, message, traceback

    def __str__(self) -> str:
        return f"{self.type}: {self.message}"

    def __repr__(self) -> str:
        return f"TaskException({self.type!r}, {self.message!r})"


class TaskData:
    """A task's artifacts as attributes; ``name in data`` tests for one."""

    def __init__(self, artifacts: dict[str, DataArtifact], pathspec: str, values: bool = True) -> None:
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

    def __iter__(self) -> Iterator[DataArtifact]:
        return iter(list(self._artifacts.values()))

    def __dir__(self) -> list[str]:
        return sorted(self._artifacts)

    def __repr__(self) -> str:
        return f"<data of {self._pathspec}: {', '.join(sorted(self._artifacts))}>"


class DataArtifact(ClientObject):
    """One artifact of a task: ``.data`` (loaded on first access, then cached), ``.sha``, ``.size``."""

    def __init__(self, pathspec: str, *, attempt: int | None = None, db: MetadataDB | None = None,
                 store: BlobStore | None = None, _namespace_check: bool = True) -> None:
        flow, run_id, step, task_id, name = split_pathspec(pathspec, 5, "artifact")
        from stoker.store.client import Task

        task = Task(f"{flow}/{run_id}/{step}/{task_id}", attempt=attempt, db=db, store=store,
                    _namespace_check=_namespace_check)
        rec = next((r for r in task._records() if r.name == name), None)
        if rec is None:
            raise NotFound(f"task {task.pathspec} has no artifact {name!r}")
        self._init(task, rec)

    @classmethod
    def _from(cls, task: Task, rec: ArtifactRecord) -> DataArtifact:
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
            self._value = load_artifact(t._store, desc)
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
