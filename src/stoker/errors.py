"""The error hierarchy. Every message names the problem and the fix; the CLI prints it without a traceback."""

from __future__ import annotations

# Exit codes a task (or a torchrun worker) uses to tell the scheduler what a failure means.
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped by SIGTERM after committing a checkpoint; retry and resume
EXIT_PERMANENT = 78  # EX_CONFIG: a deterministic error (bad configuration); running it again cannot help


class StokerError(Exception):
    """Base of every error stoker raises on purpose."""

    exit_code = 1
    permanent = False  # True: the same input fails the same way, so the scheduler does not retry it


class GraphError(StokerError):
    """The flow's graph is malformed (found before anything runs)."""


class ConfigError(StokerError):
    """A setting, parameter or config file is wrong (raised in a step: the task is not retried)."""

    permanent = True


class DataError(StokerError):
    """A corpus, tokenizer or prepared dataset is unusable."""


class StoreError(StokerError):
    """The blob store or metadata index cannot be read or written."""


class BackendError(StokerError):
    """A backend could not submit, watch or cancel work."""


class TaskFailed(StokerError):
    """A step's task failed (after its retries)."""


class Preempted(StokerError):
    """Training stopped on SIGTERM (a preemption) after committing a checkpoint: retry and resume from it."""

    exit_code = EXIT_PREEMPTED

    def __init__(self, message: str, step: int | None = None) -> None:
        super().__init__(message)
        self.step = step  # the committed step a retry resumes from


class TrainingError(StokerError):
    """Training cannot go on (NaN loss, incompatible checkpoint, ...)."""


class CheckpointError(TrainingError):
    """A checkpoint is missing, torn, corrupted or from another config."""
