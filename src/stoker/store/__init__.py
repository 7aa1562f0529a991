"""The store: content-addressed blob store, artifact serialization, metadata index and client API.

See docs/store.md. Importing this package never imports torch.
"""

from stoker.store.artifacts import artifact_blobs, load_artifact, save_artifact
from stoker.store.blob import BlobStore, LocalBlobStore, open_store
from stoker.store.client import DataArtifact, Flow, Metaflow, Run, Step, Task, TaskData, TaskException
from stoker.store.client_base import Metadata, default_metadata, get_metadata  # not metadata(): the submodule
from stoker.store.manifest import (
    attempt_prefix,
    clone_manifest,
    latest_manifest,
    log_name,
    manifest_name,
    read_manifest,
    read_run_record,
    run_prefix,
    validate_manifest,
    write_manifest,
    write_run_record,
)
from stoker.store.metadata import MetadataDB
from stoker.store.namespaces import (
    MetaflowNamespaceMismatch,
    MetaflowNotFound,
    NamespaceMismatch,
    NotFound,
    default_namespace,
    get_namespace,
    namespace,
)
from stoker.store.paths import current_user, default_db_path, default_store_url, home_dir
from stoker.store.records import ArtifactRecord, AttemptRecord, RunRecord, StepRecord, TaskRecord

__all__ = [
    "ArtifactRecord", "AttemptRecord", "BlobStore", "DataArtifact", "Flow", "LocalBlobStore", "Metadata", "Metaflow",
    "default_metadata", "get_metadata",
    "MetaflowNamespaceMismatch", "MetaflowNotFound", "MetadataDB", "NamespaceMismatch", "NotFound", "Run",
    "RunRecord", "Step", "StepRecord", "Task", "TaskData", "TaskException", "TaskRecord", "artifact_blobs",
    "attempt_prefix", "clone_manifest", "current_user", "default_db_path", "default_namespace", "default_store_url",
    "get_namespace", "home_dir", "latest_manifest", "load_artifact", "log_name", "manifest_name", "namespace", "open_store",
    "read_manifest", "read_run_record", "run_prefix", "save_artifact", "validate_manifest", "write_manifest", "write_run_record",
]
