"""`stoker ui`: a read-only web UI over the metadata index and the blob store (see docs/ui.md)."""
