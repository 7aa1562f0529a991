"""Plain records returned by :class:`stoker.store.metadata.MetadataDB` reads."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from stoker.errors import StoreError

RUN_STATUSES = ("running", "succeeded", "failed", "killed")
TASK_STATUSES = ("running", "ok", "failed")


def natural_key(text: str) -> tuple:
    """Sort key putting ``"2"`` before ``"10"`` (numeric ids) and other ids after, alphabetically."""
    return (0, int(text), "") if text.isdigit() else (1, 0, text)


MAX_TAG_SIZE = 500  # Metaflow's limits (metaflow/tagging_util.py)
MAX_USER_TAG_SET_SIZE = 50


def check_tag(tag: str) -> str:
    """Return ``tag`` if it is a valid tag as Metaflow defines one: a non-empty UTF-8 string (bytes are decoded)
    of at most 500 characters."""
    if isinstance(tag, bytes):
        try:
            tag = tag.decode("utf-8")
        except UnicodeError:
            raise StoreError(f"invalid tag {tag!r}: tags must be UTF-8 decodable") from None
    if not isinstance(tag, str):
        raise StoreError(f"invalid tag {tag!r}: tags must be strings, got {type(tag).__name__}")
    try:
        tag.encode("utf-8")
    except UnicodeError:
        raise StoreError(f"invalid tag {tag!r}: tags must be UTF-8 encodable") from None
    if not tag.strip():
        raise StoreError(f"invalid tag {tag!r}: tags must not be empty")
    if len(tag) > MAX_TAG_SIZE:
        raise StoreError(f"invalid tag {tag[:40]!r}...: tag is too long {len(tag)} > {MAX_TAG_SIZE}")
    return tag


@dataclass(frozen=True)
class RunRecord:
    """A run as indexed: status is one of running/succeeded/failed/killed; times are epoch seconds."""

    flow: str
    run_id: str
    user: str | None
    status: str
    created_at: float
    finished_at: float | None
    params: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] | None = None
    origin_run_id: str | None = None
    user_tags: tuple[str, ...] = ()
    system_tags: tuple[str, ...] = ()

    @property
    def tags(self) -> tuple[str, ...]:
        """User and system tags together, sorted."""
        return tuple(sorted(self.user_tags + self.system_tags))

    @property
    def pathspec(self) -> str:
        return f"{self.flow}/{self.run_id}"


@dataclass(frozen=True)
class StepRecord:
    """A step of a run with the count of its tasks by status (of their latest attempt)."""

    flow: str
    run_id: str
    step: str
    created_at: float
    num_tasks: int
    num_ok: int
    num_failed: int
    num_running: int
    finished_at: float | None

    @property
    def pathspec(self) -> str:
        return f"{self.flow}/{self.run_id}/{self.step}"


@dataclass(frozen=True)
class TaskRecord:
    """A task, reflecting its latest attempt (status running/ok/failed)."""

    flow: str
    run_id: str
    step: str
    task_id: str
    attempt: int
    status: str
    started_at: float | None
    finished_at: float | None
    foreach_index: tuple[int, ...] = ()

    @classmethod
    def from_row(cls, row: tuple) -> TaskRecord:
        *head, index = row
        return cls(*head, foreach_index=tuple(json.loads(index or "[]")))

    @property
    def pathspec(self) -> str:
        return f"{self.flow}/{self.run_id}/{self.step}/{self.task_id}"


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt of a task; ``manifest`` is None while it runs (registered, not yet ingested)."""

    flow: str
    run_id: str
    step: str
    task_id: str
    attempt: int
    status: str
    started_at: float | None
    finished_at: float | None
    user: str | None
    hostname: str | None
    manifest: dict[str, Any] | None

    @classmethod
    def from_row(cls, row: tuple) -> AttemptRecord:
        *head, manifest = row
        return cls(*head, manifest=None if manifest is None else json.loads(manifest))


@dataclass(frozen=True)
class ArtifactRecord:
    """An artifact of a task attempt: its descriptor (see stoker.store.artifacts) and summary columns."""

    name: str
    kind: str | None
    type: str | None
    sha: str | None
    size: int | None
    descriptor: dict[str, Any]
