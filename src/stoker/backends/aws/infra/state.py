"""What `stoker infra` created: `$STOKER_HOME/infra/<name>.json`, written after every create and delete.

    {"version": 1, "name": ..., "region": ..., "config": {...},
     "resources": {"compute_environment": {"kind": ..., "name": ..., "id": ..., "arn": ...,
                                           "created_by_stoker": true}, ...},
     "outputs": {"region": ..., "queue": ..., ...},      # after a complete apply; None otherwise
     "pushed_image": {"ref": "REPO@sha256:...", ...}}    # the last `stoker image build --push` to its repository

`load_outputs()` is what the Batch backend reads for its defaults (queue, image, job role, store).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from stoker.errors import ConfigError
from stoker.store.paths import home_dir

OUTPUT_KEYS = ("region", "queue", "job_role_arn", "execution_role_arn", "image", "ecr_repository_uri", "bucket",
               "store_url", "log_group", "instance_types", "compute_environment", "placement_group",
               "launch_template", "store_key_secret_arn")


def default_name() -> str:
    return os.environ.get("STOKER_INFRA") or "stoker"


def state_path(name: str) -> Path:
    return home_dir() / "infra" / f"{name}.json"


class State:
    """The state file of one infra, saved atomically on every change."""

    def __init__(self, name: str, data: dict[str, Any] | None = None) -> None:
        self.name = name
        self.path = state_path(name)
        self.data = data or {"version": 1, "name": name, "region": None, "config": None, "resources": {},
                             "outputs": None}

    @classmethod
    def load(cls, name: str) -> State:
        path = state_path(name)
        if not path.is_file():
            return cls(name)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ConfigError(f"infra state {path} is unreadable ({e}): restore it from a backup, or move it "
                              "away and run `stoker infra apply`, which finds stoker's resources by their tags"
                              ) from None
        data.setdefault("resources", {})
        return cls(name, data)

    @property
    def exists(self) -> bool:
        return self.path.is_file()

    @property
    def resources(self) -> dict[str, dict[str, Any]]:
        return self.data["resources"]

    def get(self, key: str) -> dict[str, Any] | None:
        return self.resources.get(key)

    def created(self, key: str) -> bool:
        return bool((self.get(key) or {}).get("created_by_stoker"))

    def record(self, key: str, **fields: Any) -> None:
        rec = {**(self.get(key) or {}), **fields, "updated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self.resources[key] = rec
        self.save()

    def forget(self, key: str) -> None:
        if self.resources.pop(key, None) is not None:
            self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, self.path)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def record_image(ref: str, repository: str, name: str | None = None) -> str | None:
    """Record `ref` (REPOSITORY@sha256:..., just pushed) as the image of infra `name` when `repository` is that
    infra's ECR repository: the Batch backend's default image from then on. Returns the infra's name, or None
    when nothing was recorded (no such infra, another repository, or `ref` is not a digest)."""
    state = State.load(name or default_name())
    outputs = state.data.get("outputs")
    if not state.exists or not isinstance(outputs, dict) or "@sha256:" not in ref:
        return None
    if outputs.get("ecr_repository_uri") != repository or not ref.startswith(f"{repository}@"):
        return None
    state.data["pushed_image"] = {"ref": ref, "repository": repository,
                                  "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    outputs["image"] = ref
    state.save()
    return state.name


def pushed_image(state: State, repository: str) -> str | None:
    """The digest last pushed to `repository` (see record_image), or None."""
    got = state.data.get("pushed_image") or {}
    return got.get("ref") if got.get("repository") == repository else None


def load_outputs(name: str | None = None) -> dict[str, Any] | None:
    """The outputs of the last complete `stoker infra apply` of `name` (default `$STOKER_INFRA` or "stoker"):
    region, queue, job_role_arn, execution_role_arn, image (the digest `stoker image build --push` recorded, None
    before a push), ecr_repository_uri, bucket, store_url, log_group,
    instance_types, compute_environment, placement_group, launch_template, store_key_secret_arn (the secret holding
    the store's signing key). None when there is none."""
    path = state_path(name or default_name())
    if not path.is_file():
        return None
    try:
        outputs = json.loads(path.read_text(encoding="utf-8")).get("outputs")
    except (OSError, ValueError):
        return None
    if not isinstance(outputs, dict):
        return None
    return {k: outputs.get(k) for k in OUTPUT_KEYS}
