"""``torchrun --nproc-per-node N -m stoker.train --config run.toml --set train.lr=3e-4 --steps 200``.

Flags: ``--config FILE`` (TOML: stoker's, or torchtitan's JobConfig layout, detected by its sections or forced
with ``--config-format torchtitan``, see docs/from-torchtitan.md), ``--set section.key=value`` (repeatable),
``--section.key value`` or
``--section.key=value``, and the short forms ``--data --model --steps --lr --seed --tp --dp-mode
--checkpoint-dir --resume-from --micro-batch-size --global-batch-size --out-dir``. Rank 0 prints a one-line
summary (steps, final loss, tokens/s, time, checkpoint) and writes the full result as JSON to
``<out_dir>/result.json`` (and to ``--result-file PATH``); ``--json`` prints that JSON line instead of the
summary, for scripts. Errors are printed without a traceback and exit non-zero. ``--help`` lists every
setting with its default and meaning (from :mod:`stoker.train.settings`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

from stoker.errors import ConfigError, Preempted, StokerError

log = logging.getLogger("stoker.train")
# what the trainer imports late, when training starts: a warm launcher (distributed/zygote.py) imports them once for
# every rank it forks (seconds per rank otherwise: torch._dynamo alone is 1-2 s); none of them starts a thread
WARM_IMPORTS = ("torch._dynamo", "torch.utils.tensorboard", "stoker.data", "rich.console", "rich.progress", "psutil")


RESULT_FILE: list[str] = []  # --result-file PATH: rank 0 also writes the result JSON there (flows read it)
CONFIG_FORMAT: list[str] = []  # --config-format auto|stoker|torchtitan (the last one given counts)
AS_JSON: list[bool] = []  # --json: rank 0 prints the result as one JSON line instead of the summary


def summary_line(result: dict, seconds: float) -> str:
    """The human summary rank 0 prints: steps, final loss, tokens/s, time and the checkpoint."""
    loss = result.get("final_loss")
    parts = [f"{result.get('step', 0)} steps", f"final loss {loss:.4f}" if loss is not None else "no new steps",
             f"{result.get('tokens_per_s') or 0:,.0f} tokens/s", f"{seconds:.1f} s"]
    tail = f"; checkpoint {result['checkpoint']}" if result.get("checkpoint") else ""
    return "stoker.train: " + ", ".join(parts) + tail


def parse_args(argv: list[str]) -> tuple[str | None, list[str], bool]:
    """(config path, overrides, print_config) from the command line."""
    config, overrides, print_config = None, [], False
    RESULT_FILE.clear()
    CONFIG_FORMAT.clear()
    AS_JSON.clear()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            from stoker.train.settings import settings_help

            print(__doc__)
            print(settings_help())
            raise SystemExit(0)
        if not arg.startswith("--"):
            raise ConfigError(f"unexpected argument {arg!r}; use --config FILE, --set key=value or --key value")
        key, has_value, value = arg[2:].partition("=")
        if key == "print-config":
            print_config = True
            i += 1
            continue
        if key == "json" and not has_value:
            AS_JSON.append(True)
            i += 1
            continue
        if not has_value:
            if i + 1 >= len(argv):
                raise ConfigError(f"{arg} needs a value")
            value, i = argv[i + 1], i + 1
        i += 1
        if key == "config":
            config = value
        elif key == "result-file":
            RESULT_FILE.append(value)
        elif key == "config-format":
            CONFIG_FORMAT.append(value)
        elif key == "set":
            overrides.append(value)
        else:
            overrides.append(f"{key.replace('-', '_')}={value}")
    return config, overrides, print_config


def main(argv: list[str] | None = None) -> int:
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"[rank{rank}] %(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        from stoker.train.config import load_config

        path, overrides, print_config = parse_args(list(sys.argv[1:] if argv is None else argv))
        cfg = load_config(path, overrides, config_format=(CONFIG_FORMAT or ["auto"])[-1])
        if print_config:
            print(json.dumps(cfg.to_dict(), indent=1))
            return 0
        from stoker.train.trainer import run_training

        started = time.perf_counter()
        result = run_training(cfg)
        seconds = time.perf_counter() - started
    except StokerError as e:
        from stoker.exitstatus import exit_code_for, write_status

        # a preemption is an expected stop (checkpoint committed, a retry resumes): one line per rank, not an error
        print(f"[rank{rank}] {'preempted' if isinstance(e, Preempted) else 'error'}: {e}", file=sys.stderr)
        code = exit_code_for(e)  # 75: preempted, retry and resume; 78: deterministic, do not retry
        write_status(code, e)  # torchrun exits 1 whatever the code: the launching task reads it here
        return code
    if rank == 0:
        result.pop("config", None)
        result["seconds"] = round(seconds, 3)
        print(json.dumps(result) if AS_JSON else summary_line(result, seconds), flush=True)
        for path in [*RESULT_FILE, os.path.join(cfg.out_dir, "result.json")]:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            tmp = f"{path}.tmp"
            with open(tmp, "w") as f:
                json.dump(result, f)
            os.replace(tmp, path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
