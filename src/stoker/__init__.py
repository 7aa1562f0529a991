"""stoker: develop, run and scale LLM training pipelines."""

__version__ = "0.1.0"
