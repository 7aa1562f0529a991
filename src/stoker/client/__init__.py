"""The client: Metaflow's ``Flow``, ``Run``, ``Step``, ``Task`` ... over the metadata index and the blob store
(see docs/store.md, "Client"). ``from stoker import Flow, Run, ...`` re-exports these names.

Layering: the client reads :mod:`stoker.store` (records, the index, blobs); it never imports the runtime or
the CLI. Importing it never imports torch.
"""

from stoker.client.base import Metadata, default_metadata, get_metadata, metadata
from stoker.client.core import DataArtifact, Flow, Metaflow, Run, Step, Task, TaskData, TaskException
from stoker.client.namespaces import (
    MetaflowNamespaceMismatch,
    MetaflowNotFound,
    NamespaceMismatch,
    NotFound,
    default_namespace,
    get_namespace,
    namespace,
)

__all__ = [
    "DataArtifact", "Flow", "Metadata", "Metaflow", "MetaflowNamespaceMismatch", "MetaflowNotFound",
    "NamespaceMismatch", "NotFound", "Run", "Step", "Task", "TaskData", "TaskException", "default_metadata",
    "default_namespace", "get_metadata", "get_namespace", "metadata", "namespace",
]
