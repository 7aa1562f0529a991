"""``torchrun --nproc-per-node N -m stoker.train --config run.toml --set train.lr=3e-4 --steps 200``.

Flags: ``--config FILE`` (TOML), ``--set section.key=value`` (repeatable), ``--section.key value`` or
``--section.key=value``, and the short forms ``--data --model --steps --lr --seed --tp --dp-mode
--checkpoint-dir --resume-from --micro-batch-size --global-batch-size --out-dir``. Prints the result
as one JSON line on rank 0; errors are printed without a traceback and exit non-zero.
"""

from __future__ import annotations

import json
import logging
import os
import sys

from stoker.errors import ConfigError, StokerError

log = logging.getLogger("stoker.train")


RESULT_FILE: list[str] = []  # --result-file PATH: rank 0 also writes the result JSON there (flows read it)


def parse_args(argv: list[str]) -> tuple[str | None, list[str], bool]:
    """(config path, overrides, print_config) from the command line."""
    config, overrides, print_config = None, [], False
    RESULT_FILE.clear()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            print(__doc__)
            raise SystemExit(0)
        if not arg.startswith("--"):
            raise ConfigError(f"unexpected argument {arg!r}; use --config FILE, --set key=value or --key value")
        key, has_value, value = arg[2:].partition("=")
        if key == "print-config":
            print_config = True
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
        cfg = load_config(path, overrides)
        if print_config:
            print(json.dumps(cfg.to_dict(), indent=1))
            return 0
        from stoker.train.trainer import run_training

        result = run_training(cfg)
    except StokerError as e:
        from stoker.exitstatus import exit_code_for, write_status

        print(f"[rank{rank}] error: {e}", file=sys.stderr)
        code = exit_code_for(e)  # 75: preempted, retry and resume; 78: deterministic, do not retry
        write_status(code, e)  # torchrun exits 1 whatever the code: the launching task reads it here
        return code
    if rank == 0:
        result.pop("config", None)
        print(json.dumps(result))
        for path in RESULT_FILE:
            tmp = f"{path}.tmp"
            with open(tmp, "w") as f:
                json.dump(result, f)
            os.replace(tmp, path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
