"""The store, in layers (each imports only the ones before it; none imports the client, runtime or CLI):

- :mod:`stoker.store.objects`: object I/O, the only code that reads and writes storage (a folder, ``s3://``,
  fsspec URLs);
- :mod:`stoker.store.blobs`: content-addressed blobs (verified on read) and named objects, over any object store;
- records over blobs: :mod:`.artifacts`, :mod:`.manifest` (task manifests and run records), :mod:`.signing`,
  :mod:`.series` / :mod:`.metrics`; and the index of them, :mod:`.metadata` (:class:`MetadataDB`) with
  :mod:`.records`.

The client (``Flow``, ``Run``, ``Task`` ...) is :mod:`stoker.client`. This package exports the few names a
user needs (see docs/store.md); stoker's own modules import from the submodules. Importing it never imports torch.
"""

from stoker.store.artifacts import load_artifact, save_artifact
from stoker.store.blobs import BlobStore, open_store
from stoker.store.metadata import MetadataDB
from stoker.store.objects import ObjectStore, open_objects

__all__ = ["BlobStore", "MetadataDB", "ObjectStore", "load_artifact", "open_objects", "open_store", "save_artifact"]
