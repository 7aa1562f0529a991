"""`@batch(...)`: run a step on AWS Batch (`--with batch:queue=x` does the same from the CLI).

Metaflow's argument names and meanings; only settings are recorded and checked here, the backend renders
them into a job definition. As in Metaflow, each resource is the larger of `@batch` and `@resources`, with
Batch's defaults (1 vCPU, 4096 MiB) when neither gives one. Import-light: `stoker` imports this module.
"""

from __future__ import annotations

import re
from typing import Any

from stoker.errors import ConfigError
from stoker.flow.decorators import StepDecorator, make_step_decorator

RESOURCE_DEFAULTS = {"cpu": 1, "memory": 4096, "gpu": 0}
COUNTS = ("cpu", "gpu", "memory", "trainium", "inferentia", "efa", "shared_memory", "max_swap", "swappiness",
          "tmpfs_size", "ephemeral_storage")


class BatchDecorator(StepDecorator):
    """Run this step on AWS Batch: a task is a single-node job, a `num_parallel` gang one multi-node job.

    cpu, memory (MiB), gpu: per node; trainium / inferentia: Neuron devices per node (mapped as /dev/neuronN);
    efa: EFA interfaces per node (mapped as /dev/infiniband/uverbsN, memlock unlimited); image: the container
    image (default: `stoker infra`'s ECR repository, or $STOKER_BATCH_IMAGE); queue: the job queue (default:
    `stoker infra`'s, or $STOKER_BATCH_QUEUE); iam_role: the job role ARN; execution_role: the ECS execution
    role ARN; shared_memory (MiB, /dev/shm); use_tmpfs, tmpfs_size (MiB), tmpfs_path; max_swap (MiB),
    swappiness (0-100); host_volumes (host paths mounted at the same path); privileged; aws_batch_tags (a dict);
    instance_type (stoker: checks the request against that type's ECS memory and prices the run);
    ephemeral_storage, log_driver, log_options, efs_volumes, tmpfs_tempdir, executable: accepted as in Metaflow.
    """

    name = "batch"
    engine = "batch"
    defaults: dict[str, Any] = {
        "cpu": None, "gpu": None, "memory": None, "image": None, "queue": None, "iam_role": None,
        "execution_role": None, "shared_memory": None, "max_swap": None, "swappiness": None, "inferentia": None,
        "trainium": None, "efa": None, "host_volumes": None, "efs_volumes": None, "use_tmpfs": False,
        "tmpfs_tempdir": True, "tmpfs_size": None, "tmpfs_path": "/stoker_temp", "ephemeral_storage": None,
        "log_driver": None, "log_options": None, "executable": None, "privileged": False, "aws_batch_tags": None,
        "instance_type": None,
    }

    def validate(self) -> None:
        a = self.attributes
        for key in COUNTS:
            if a[key] is not None:
                a[key] = self._count(key, a[key])
        if a["swappiness"] is not None and a["swappiness"] > 100:
            raise ConfigError(f"@batch(swappiness={a['swappiness']}): must be between 0 and 100")
        if a["trainium"] and a["inferentia"]:
            raise ConfigError("@batch(trainium=..., inferentia=...): a node has one kind of Neuron device; set one")
        if a["tmpfs_size"] and not a["use_tmpfs"]:
            a["use_tmpfs"] = True  # Metaflow: a size implies tmpfs
        for key in ("image", "queue", "iam_role", "execution_role", "instance_type", "tmpfs_path"):
            v = a[key]
            if v is not None and (not isinstance(v, str) or not v.strip() or any(c.isspace() for c in v)):
                raise ConfigError(f"@batch({key}={v!r}): must be a non-empty string without spaces")
        if a["instance_type"] and not re.fullmatch(r"[a-z0-9-]+\.[a-z0-9-]+", a["instance_type"]):
            raise ConfigError(f"@batch(instance_type={a['instance_type']!r}): use an EC2 type like 'trn1.32xlarge'")
        for key in ("use_tmpfs", "tmpfs_tempdir", "privileged"):
            if not isinstance(a[key], bool):
                raise ConfigError(f"@batch({key}={a[key]!r}): must be True or False")
        vols = a["host_volumes"] or []
        if isinstance(vols, str):
            vols = [v for v in vols.split(",") if v]
        if not isinstance(vols, (list, tuple)) or not all(isinstance(v, str) and v.startswith("/") for v in vols):
            raise ConfigError(f"@batch(host_volumes={a['host_volumes']!r}): must be absolute host paths, "
                              f"e.g. host_volumes=['/fsx']")
        a["host_volumes"] = list(vols)
        tags = a["aws_batch_tags"] or {}
        if not isinstance(tags, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in tags.items()):
            raise ConfigError(f"@batch(aws_batch_tags={a['aws_batch_tags']!r}): must be a dict of strings")
        a["aws_batch_tags"] = dict(tags)

    def _count(self, key: str, v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            raise ConfigError(f"@batch({key}={v!r}): must be a whole number, e.g. {key}=4")
        try:
            n = float(v)
        except ValueError:
            raise ConfigError(f"@batch({key}={v!r}): must be a whole number, e.g. {key}=4") from None
        if n < 0 or n != int(n):
            raise ConfigError(f"@batch({key}={v!r}): must be a whole number of at least 0")
        return int(n)


def node_resources(options: dict[str, Any], resources: dict[str, Any]) -> dict[str, int]:
    """Per-node resources of a @batch step: the larger of @batch and @resources, Batch's defaults otherwise."""
    out: dict[str, int] = {}
    for key in ("cpu", "memory", "gpu", "trainium", "inferentia", "efa", "shared_memory"):
        vals = [int(float(v)) for v in (options.get(key), resources.get(key)) if v is not None]
        out[key] = max(vals) if vals else RESOURCE_DEFAULTS.get(key, 0)
    return out


batch = make_step_decorator(BatchDecorator)  # registered for --with batch:...
