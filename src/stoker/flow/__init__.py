"""The flow API: FlowSpec, @step, decorators, run inputs, `current` and the static graph."""

from .current import current
from .decorators import catch, environment, parallel, resources, retry, step, timeout, torchrun
from .graph import FlowGraph
from .lint import lint
from .parameters import Config, IncludeFile, JSONType, Parameter
from .spec import FlowSpec, MergeArtifactsError

__all__ = ["FlowSpec", "step", "Parameter", "Config", "IncludeFile", "JSONType", "current", "retry", "catch",
           "timeout", "resources", "environment", "parallel", "torchrun", "FlowGraph", "lint",
           "MergeArtifactsError"]
