"""The flow API: FlowSpec, @step, decorators, run inputs, `current` and the static graph."""

from .current import current
from .decorators import parallel, step
from .graph import FlowGraph
from .lint import lint
from .parameters import Config, IncludeFile, JSONType, Parameter
from .spec import FlowSpec, MergeArtifactsError

__all__ = ["FlowSpec", "step", "Parameter", "Config", "IncludeFile", "JSONType", "current", "retry", "catch",
           "timeout", "resources", "environment", "parallel", "torchrun", "FlowGraph", "lint",
           "MergeArtifactsError"]
_FEATURES = {"retry", "catch", "timeout", "resources", "environment", "torchrun"}


def __getattr__(name: str) -> object:
    """The decorators that moved to stoker.features (one module each), still importable from here."""
    if name in _FEATURES:
        from .. import features

        return getattr(features, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
