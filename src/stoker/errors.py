"""The error hierarchy. Every message names the problem and the fix; the CLI prints it without a traceback."""

from __future__ import annotations


class StokerError(Exception):
    """Base of every error stoker raises on purpose."""

    exit_code = 1


class GraphError(StokerError):
    """The flow's graph is malformed (found before anything runs)."""


class ConfigError(StokerError):
    """A setting, parameter or config file is wrong."""


class DataError(StokerError):
    """A corpus, tokenizer or prepared dataset is unusable."""


class StoreError(StokerError):
    """The blob store or metadata index cannot be read or written."""


class BackendError(StokerError):
    """A backend could not submit, watch or cancel work."""


class TaskFailed(StokerError):
    """A step's task failed (after its retries)."""


class TrainingError(StokerError):
    """Training cannot go on (NaN loss, incompatible checkpoint, ...)."""


class CheckpointError(TrainingError):
    """A checkpoint is missing, torn, corrupted or from another config."""
