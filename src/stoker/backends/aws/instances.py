"""EC2 instance types stoker knows: what each has, what it exposes to ECS, and what it costs.

Batch places a job only on an instance whose *ECS-registered* memory covers the request, and that is less than
the nominal size: the kernel takes its share and the ECS agent reserves more (AWS Batch user guide, "Compute
resource memory management": an m4.large sold as 8 GiB registers 7,985 MiB). A trn1.32xlarge is sold as 512 GiB
(524,288 MiB), so a job definition asking for 512 GiB stays RUNNABLE forever. AWS publishes no per-type table of
registered memory, so the figures here are *estimates*: 507,821 MiB for trn1.32xlarge (an unsourced figure, 96.9%
of nominal) and `ECS_FRACTION` of the nominal memory for the other types. Measure a type where it matters:
`aws ecs describe-container-instances --cluster CLUSTER --container-instances ID --query
'containerInstances[].registeredResources[?name==`MEMORY`].integerValue'` on a running node of the compute
environment (the ECS cluster's name starts with the compute environment's), or the ECS console's "Total capacity"
(AWS Batch user guide, "Tutorial: View compute resource memory"); then put the number in `$STOKER_PRICES`.

`$STOKER_PRICES` is a TOML file of overrides: top-level `"type" = dollars_per_hour`, and an optional table
`[ecs_memory_mib]` of `"type" = MiB` (measured registered memory). Prices are on-demand Linux USD per hour in
us-east-1 (AWS pricing pages, 2025), for the cost estimate only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

ECS_FRACTION = 0.968  # 507,821 / 524,288 = 0.9686 (the trn1.32xlarge estimate), rounded down
MEMORY_TABLE = "ecs_memory_mib"  # the table of $STOKER_PRICES with measured registered memory


@dataclass(frozen=True)
class InstanceType:
    name: str
    vcpus: int
    memory_gib: int  # nominal
    gpus: int = 0
    gpu_model: str = ""
    neuron_devices: int = 0  # Trainium or Inferentia chips
    neuron_cores: int = 0  # NeuronCores across all chips (what torchrun's nproc_per_node follows)
    efa_interfaces: int = 0  # network cards with an EFA interface (0: no EFA)
    price: float | None = None  # on-demand USD per hour
    ecs_memory_known: int | None = None  # MiB registered with ECS: an estimate, or $STOKER_PRICES's measurement

    @property
    def family(self) -> str:
        return self.name.split(".")[0]

    @property
    def trainium(self) -> bool:
        return self.family.startswith("trn")

    @property
    def inferentia(self) -> bool:
        return self.family.startswith("inf")

    @property
    def ecs_memory_mib(self) -> int:
        """The memory a Batch job on this type may ask for, in MiB."""
        return self.ecs_memory_known or int(self.memory_gib * 1024 * ECS_FRACTION)

    @property
    def cores_per_device(self) -> int:
        return self.neuron_cores // self.neuron_devices if self.neuron_devices else 0


_TYPES = [
    # Trainium: trn1 has 2 NeuronCore-v2 per chip; trn2 has 8 physical cores per chip, seen as 4 logical
    # cores (LNC=2, the Neuron SDK's default), so 64 per trn2.48xlarge.
    InstanceType("trn1.2xlarge", 8, 32, neuron_devices=1, neuron_cores=2, price=1.34375),
    InstanceType("trn1.32xlarge", 128, 512, neuron_devices=16, neuron_cores=32, efa_interfaces=8, price=21.50,
                 ecs_memory_known=507_821),  # estimate, no published source: measure it (module doc)
    InstanceType("trn1n.32xlarge", 128, 512, neuron_devices=16, neuron_cores=32, efa_interfaces=16, price=24.78),
    InstanceType("trn2.48xlarge", 192, 2048, neuron_devices=16, neuron_cores=64, efa_interfaces=16, price=None),
    # Inferentia2: 2 NeuronCore-v2 per chip
    InstanceType("inf2.xlarge", 4, 16, neuron_devices=1, neuron_cores=2, price=0.7582),
    InstanceType("inf2.8xlarge", 32, 128, neuron_devices=1, neuron_cores=2, price=1.9679),
    InstanceType("inf2.24xlarge", 96, 384, neuron_devices=6, neuron_cores=12, price=6.4906),
    InstanceType("inf2.48xlarge", 192, 768, neuron_devices=12, neuron_cores=24, price=12.9813),
    # NVIDIA GPUs
    InstanceType("g5.xlarge", 4, 16, gpus=1, gpu_model="A10G", price=1.006),
    InstanceType("g5.12xlarge", 48, 192, gpus=4, gpu_model="A10G", price=5.672),
    InstanceType("g5.48xlarge", 192, 768, gpus=8, gpu_model="A10G", efa_interfaces=1, price=16.288),
    InstanceType("g6.12xlarge", 48, 192, gpus=4, gpu_model="L4", price=4.6016),
    InstanceType("p4d.24xlarge", 96, 1152, gpus=8, gpu_model="A100", efa_interfaces=4, price=21.9576),
    InstanceType("p5.48xlarge", 192, 2048, gpus=8, gpu_model="H100", efa_interfaces=32, price=55.04),
    # CPU
    InstanceType("m5.xlarge", 4, 16, price=0.192),
    InstanceType("m5.2xlarge", 8, 32, price=0.384),
    InstanceType("c5.xlarge", 4, 8, price=0.17),
    InstanceType("c5.4xlarge", 16, 32, price=0.68),
    InstanceType("c5n.18xlarge", 72, 192, efa_interfaces=1, price=3.888),
]
INSTANCE_TYPES: dict[str, InstanceType] = {t.name: t for t in _TYPES}


def instance_type(name: str) -> InstanceType | None:
    """The known type `name`, with `$STOKER_PRICES` applied; None when stoker does not know it."""
    t = INSTANCE_TYPES.get(name)
    if t is None:
        return None
    changes: dict[str, object] = {}
    price = price_overrides().get(name)
    if price is not None:
        changes["price"] = price
    memory = memory_overrides().get(name)
    if memory is not None:
        changes["ecs_memory_known"] = memory
    return InstanceType(**{**t.__dict__, **changes}) if changes else t


@lru_cache(maxsize=4)
def _read_overrides(path: str) -> tuple[dict[str, float], dict[str, int]]:
    from stoker.errors import ConfigError
    from stoker.flow.parameters import parse_config_text

    with open(path, encoding="utf-8") as f:
        data = parse_config_text(f.read(), json_format=False)
    memory = data.pop(MEMORY_TABLE, None) or {}
    try:
        if not isinstance(memory, dict):
            raise TypeError(f"{MEMORY_TABLE} is not a table")
        mem = {str(k): int(v) for k, v in memory.items()}
        if any(v <= 0 for v in mem.values()):
            raise ValueError("a memory is not a positive number of MiB")
        return {str(k): float(v) for k, v in data.items()}, mem
    except (TypeError, ValueError) as e:
        raise ConfigError(f"$STOKER_PRICES {path}: {e}. Fix: write top-level `\"type\" = dollars_per_hour` "
                          f"lines and, for memory, a table `[{MEMORY_TABLE}]` of `\"type\" = MiB`") from None


def _overrides() -> tuple[dict[str, float], dict[str, int]]:
    path = os.environ.get("STOKER_PRICES")
    return _read_overrides(os.path.abspath(os.path.expanduser(path))) if path else ({}, {})


def price_overrides() -> dict[str, float]:
    return _overrides()[0]


def memory_overrides() -> dict[str, int]:
    """Registered ECS memory (MiB) per type, measured by the user: `[ecs_memory_mib]` of `$STOKER_PRICES`."""
    return _overrides()[1]


def price_per_hour(name: str) -> float | None:
    t = instance_type(name)
    if t is not None:
        return t.price
    return price_overrides().get(name)


def known_names() -> str:
    return ", ".join(sorted(INSTANCE_TYPES))


def fits(t: InstanceType, *, cpu: float = 0, memory_mib: float = 0, gpu: int = 0, trainium: int = 0,
         inferentia: int = 0, efa: int = 0) -> str | None:
    """None when one node of type `t` can take the request, else why not (naming the number that fits)."""
    checks = [
        ("cpu", cpu, t.vcpus, "vCPUs"),
        ("memory", memory_mib, t.ecs_memory_mib, "MiB of memory registered with ECS"),
        ("gpu", gpu, t.gpus, "GPUs"),
        ("trainium", trainium, t.neuron_devices if t.trainium else 0, "Trainium devices"),
        ("inferentia", inferentia, t.neuron_devices if t.inferentia else 0, "Inferentia devices"),
        ("efa", efa, t.efa_interfaces, "EFA interfaces"),
    ]
    for key, want, have, what in checks:
        if want and want > have:
            return f"{key}={want:g} but a {t.name} has {have} {what}"
    return None
