"""The flow API: FlowSpec, @step, run inputs, `current` and the static graph. The step decorators live one layer
up, each in its own module of stoker.features (`from stoker import retry, ...`)."""

from stoker.flow.current import current
from stoker.flow.decorators import parallel, step
from stoker.flow.graph import FlowGraph
from stoker.flow.lint import lint
from stoker.flow.parameters import Config, IncludeFile, JSONType, Parameter
from stoker.flow.spec import FlowSpec, MergeArtifactsError

__all__ = ["FlowSpec", "step", "Parameter", "Config", "IncludeFile", "JSONType", "current", "parallel",
           "FlowGraph", "lint", "MergeArtifactsError"]
