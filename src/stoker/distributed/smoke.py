"""`run --smoke`: the same flow, image and config on at most 2 nodes for about 20 steps with checkpoints, then stop.

A first real run on a paid cluster should fail in minutes, not after an hour of 4 nodes: the smoke run goes
through everything the full run does (submission, image pull, data staging, preflight, compilation, training
steps, a checkpoint written and committed) at a fraction of the size. Only two things change:
- every gang (`num_parallel=N`) runs on min(N, 2) nodes (`cap_gang`, in the driver);
- `current.torch.run` shortens the training command (`command_overrides`): `stoker.train` gets
  `train.steps=20, checkpoint.every=10`; NxD's Llama scripts `--max_steps 20 --steps_this_run 20
  --checkpoint_freq 10`; any other entrypoint needs `smoke={...}`, the flags to change, or it is refused.
The run records what it shrank (`runs/FLOW/RUN/smoke.json`) so `run` can print what the full run costs per hour.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from stoker.errors import ConfigError
from stoker.store.manifest import run_prefix

ENV = "STOKER_SMOKE"  # set by `run --smoke` for the driver and every task
NODES = 2
STEPS = 20
CHECKPOINT_EVERY = 10


def enabled(env: Mapping[str, str] | None = None) -> bool:
    return (os.environ if env is None else env).get(ENV, "") not in ("", "0")


def record_name(flow: str, run_id: str) -> str:
    return f"{run_prefix(flow, run_id)}smoke.json"


def cap_gang(store: Any, flow: str, run_id: str, step: str, n: int) -> int:
    """The gang size a smoke run uses for a gang of `n` (recorded for the cost line at the end)."""
    if not enabled() or n <= NODES:
        return n
    doc = read_record(store, flow, run_id)  # a record that cannot be read is rewritten
    doc[step] = {"full": n, "ran": NODES}
    store.write(record_name(flow, run_id), json.dumps(doc).encode())
    print(f"stoker: smoke run: gang {step} runs on {NODES} of its {n} nodes, about {STEPS} steps with a "
          f"checkpoint every {CHECKPOINT_EVERY}", flush=True)
    return NODES


def read_record(store: Any, flow: str, run_id: str) -> dict[str, dict[str, int]]:
    name = record_name(flow, run_id)
    try:
        return json.loads(store.read(name)) if store.exists(name) else {}
    except Exception:  # noqa: BLE001
        return {}


def command_overrides(entrypoint: str, args: Mapping[str, Any] | Sequence[str] | None,
                      given: Mapping[str, Any] | None) -> dict[str, Any]:
    """The flags a smoke run changes in the training command (`given`: the step's own `smoke={...}`)."""
    if given:
        return dict(given)
    if entrypoint in ("stoker.train", "stoker.train.__main__"):
        return {}  # stoker.train's overrides are --set items (see `stoker_train_args`)
    flags = set(_flags(args))
    if {"--max_steps", "--checkpoint_freq"} <= flags:  # NxD's Llama scripts (tp_zero1_llama_hf_pretrain.py)
        out: dict[str, Any] = {"max_steps": STEPS, "checkpoint_freq": CHECKPOINT_EVERY}
        if "--steps_this_run" in flags:
            out["steps_this_run"] = STEPS
        return out
    raise ConfigError(f"run --smoke: stoker does not know how to shorten {entrypoint}: pass the flags to change to "
                      f"current.torch.run(..., smoke={{'max_steps': {STEPS}, 'save_every': {CHECKPOINT_EVERY}}}) "
                      f"(your script's own names), or run without --smoke")


def stoker_train_args() -> list[str]:
    return [f"--set=train.steps={STEPS}", f"--set=checkpoint.every={CHECKPOINT_EVERY}"]


def _flags(args: Mapping[str, Any] | Sequence[str] | None) -> list[str]:
    if args is None:
        return []
    if isinstance(args, Mapping):
        return [k if k.startswith("-") else f"--{k}" for k in args]
    return [str(a).split("=", 1)[0] for a in args if str(a).startswith("--")]
