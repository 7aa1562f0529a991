"""The options Metaflow accepts before the command (`python flow.py --quiet --datastore=local run`).

Each is accepted (doing what it does in stoker, or nothing where stoker has no such thing to choose), or refused
with one line saying why and what stoker uses instead. Options this module does not know (`--with`, `--config`,
...) are left in place for the command-line parser.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from dataclasses import dataclass, field

from stoker.errors import ConfigError


class TopOptionError(ConfigError):
    """An option before the command that stoker refuses; exit status 2, as a command-line usage error."""

    exit_code = 2


# Metaflow 2.19's choices for each option (metaflow/cli.py); a value outside them is refused as Metaflow does
CHOICES = {
    "--metadata": ("spin", "local", "service"),
    "--environment": ("local", "uv", "pypi", "conda"),
    "--datastore": ("spin", "azure", "gs", "s3", "local"),
    "--event-logger": ("nullSidecarLogger", "debugLogger"),
    "--monitor": ("debugMonitor", "nullSidecarMonitor"),
    "--mode": ("spin",),
}
FREE = ("--datastore-root", "--package-suffixes", "--local-config-file")
FLAGS = ("--quiet", "--not-quiet", "--pylint", "--no-pylint", "--force-rebuild-environments",
         "--no-force-rebuild-environments")

_REFUSED = {
    ("--metadata", "service"): "stoker has no metadata service: runs are indexed in $STOKER_HOME/metadata.db "
                               "(SQLite), which the client reads; drop --metadata service",
    ("--metadata", "spin"): "stoker has no spin mode; to run one step again use `resume --step STEP`",
    ("--mode", "spin"): "stoker has no spin mode; to run one step again use `resume --step STEP`",
    ("--datastore", "spin"): "stoker has no spin mode; to run one step again use `resume --step STEP`",
    ("--datastore", "azure"): "stoker's blob store is a local folder or S3 (STOKER_STORE=s3://BUCKET/PREFIX); "
                              "Azure Blob Storage is not supported",
    ("--datastore", "gs"): "stoker's blob store is a local folder or S3 (STOKER_STORE=s3://BUCKET/PREFIX); "
                           "Google Cloud Storage is not supported",
    ("--environment", "conda"): "stoker runs steps in the Python environment that runs the flow (or a "
                                "@batch/@slurm image); install the packages there and drop --environment conda",
    ("--environment", "pypi"): "stoker runs steps in the Python environment that runs the flow (or a "
                               "@batch/@slurm image); install the packages there and drop --environment pypi",
    ("--environment", "uv"): "stoker runs steps in the Python environment that runs the flow (or a "
                             "@batch/@slurm image); install the packages there and drop --environment uv",
}


@dataclass
class TopOptions:
    """What the options before the command asked for."""

    quiet: bool = False
    datastore: str = "local"
    datastore_root: str | None = None
    seen: dict[str, str] = field(default_factory=dict)

    def apply(self, environ: MutableMapping[str, str] | None = None) -> None:
        """Point this process (and the tasks it starts) at the store the options chose (in `environ`, by
        default os.environ)."""
        env = os.environ if environ is None else environ
        if self.datastore == "s3":
            store = env.get("STOKER_STORE", "")
            root = self.datastore_root or env.get("METAFLOW_DATASTORE_SYSROOT_S3") or \
                (store if store.startswith("s3://") else None)
            if not root or not root.startswith("s3://"):
                raise TopOptionError("--datastore s3 needs the bucket: pass --datastore-root s3://BUCKET/PREFIX "
                                  "(or set STOKER_STORE=s3://BUCKET/PREFIX)")
            env["STOKER_STORE"] = root
        elif self.datastore_root:
            if self.datastore_root.startswith("s3://"):
                raise TopOptionError(f"--datastore-root {self.datastore_root} is an S3 URL: add --datastore s3")
            env["STOKER_STORE"] = os.path.abspath(self.datastore_root)


def split_top_options(argv: list[str], commands: tuple[str, ...]) -> tuple[list[str], TopOptions]:
    """Take Metaflow's top-level options off the front of `argv` (up to the command); refuse what stoker
    cannot do, in one line naming what it uses instead."""
    top = TopOptions()
    rest: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in commands:
            rest.extend(argv[i:])
            break
        name, eq, value = a.partition("=")
        if a in FLAGS:
            if a in ("--quiet", "--not-quiet"):
                top.quiet = a == "--quiet"
            i += 1
            continue
        if name not in CHOICES and name not in FREE:
            rest.append(a)
            i += 1
            continue
        if not eq:
            if i + 1 >= len(argv):
                raise TopOptionError(f"{name} needs a value, e.g. {name} {CHOICES.get(name, ('VALUE',))[-1]}")
            value, i = argv[i + 1], i + 2
        else:
            i += 1
        _check(name, value)
        top.seen[name] = value
        if name == "--datastore":
            top.datastore = value
        elif name == "--datastore-root":
            top.datastore_root = value
    return rest, top


def _check(name: str, value: str) -> None:
    if name in CHOICES and value not in CHOICES[name]:
        raise TopOptionError(f"invalid value for '{name}': {value!r} is not one of {', '.join(CHOICES[name])}")
    if (name, value) in _REFUSED:
        raise TopOptionError(f"{name} {value} is not supported: {_REFUSED[(name, value)]}")
    if name == "--local-config-file":
        raise TopOptionError("--local-config-file is internal to Metaflow; pass configs with --config NAME PATH")
