"""Where tasks run: the local backend (default) and the cluster backends, chosen per step.

A step goes to the backend named by its decorator (`@slurm(...)`, `--with slurm:partition=x`), else to the
run's default backend (`run --backend slurm`, else local). Backends are created once per run, on first use.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

from stoker.errors import ConfigError
from stoker.flow.decorators import get_decorator
from stoker.runtime.contract import Backend

# name -> "module:class"; a backend's step decorator has the same name
BACKENDS: dict[str, str] = {
    "local": "stoker.backends.local:LocalBackend",
    "slurm": "stoker.backends.slurm:SlurmBackend",
    "batch": "stoker.backends.aws:BatchBackend",
}


def _plugins() -> None:
    """`$STOKER_BACKENDS=name=module:Class[,name=module:Class]` adds or replaces backends (plugins, and the
    tests' emulated engines)."""
    for item in filter(None, (p.strip() for p in os.environ.get("STOKER_BACKENDS", "").split(","))):
        name, eq, target = item.partition("=")
        if not eq or ":" not in target:
            raise ConfigError(f"STOKER_BACKENDS={os.environ['STOKER_BACKENDS']!r}: each entry is name=module:Class, "
                              f"e.g. mybackend=mypkg.backend:MyBackend")
        BACKENDS[name.strip()] = target.strip()


def make_backend(name: str, **kwargs: Any) -> Backend:
    _plugins()
    if name not in BACKENDS:
        raise ConfigError(f"unknown backend {name!r}: use one of {', '.join(sorted(BACKENDS))}")
    module, _, cls = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), cls)(**kwargs)


class StepRouter:
    """`router(step) -> Backend` for the scheduler, which never imports a backend itself.

    `default` is a backend name (every undecorated step goes there) or `NAME=STEP,STEP` (only those steps;
    the rest stay local), e.g. `--backend slurm=train` to run a packaged recipe's gang on the cluster."""

    def __init__(self, flow_cls: type, default: str = "local", flow_file: str = "",
                 factory: Callable[[str], Backend] | None = None) -> None:
        _plugins()
        name, _, steps = default.partition("=")
        if name not in BACKENDS:
            raise ConfigError(f"--backend {default}: unknown backend {name!r}; use one of {', '.join(sorted(BACKENDS))}"
                              f" (optionally NAME=STEP,STEP)")
        self.only = {s.strip() for s in steps.split(",") if s.strip()} if steps else None
        unknown = sorted((self.only or set()) - {a for a in dir(flow_cls) if getattr(getattr(flow_cls, a, None),
                                                                                     "is_step", False)})
        if unknown:
            raise ConfigError(f"--backend {default}: the flow has no step {', '.join(unknown)}")
        self.flow_cls, self.default, self.flow_file = flow_cls, name, flow_file
        self.factory = factory or (lambda n: make_backend(n, flow_file=flow_file) if n == "local" else make_backend(n))
        self.instances: dict[str, Backend] = {}

    def name_for(self, step: str) -> str:
        func = getattr(self.flow_cls, step)
        decorated = next((n for n in BACKENDS if n != "local" and self._sends(func, n, step)), None)
        if decorated:
            return decorated
        return self.default if self.only is None or step in self.only else "local"

    def _sends(self, func: Callable, name: str, step: str) -> bool:
        """The step's decorator sends it to `name`; one added by `--with NAME:...` together with `--backend
        NAME=STEP,..` only for those steps (the option configures them: `--backend batch=train --with
        batch:trainium=16`)."""
        d = get_decorator(func, name)
        if d is None:
            return False
        return d.statically_defined or self.only is None or name != self.default or step in self.only

    def __call__(self, step: str) -> Backend:
        name = self.name_for(step)
        if name not in self.instances:
            self.instances[name] = self.factory(name)
        return self.instances[name]
