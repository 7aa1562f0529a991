"""Stand-in for the `neuron-monitor` binary in tests (no Neuron tools here): `-c CONFIG`, then the recorded
documents of trn_samples.jsonl, one line each `period`, until terminated.

FAKE_NEURON_MONITOR_MODE=garbage prints a torn line and exits 2 with an error on stderr, as a broken tool would.
"""

import json
import os
import sys
import time
from pathlib import Path


def main() -> int:
    args = sys.argv[1:]
    if args[:1] != ["-c"] or len(args) != 2:
        print("usage: neuron-monitor -c CONFIG", file=sys.stderr)
        return 64
    cfg = json.loads(Path(args[1]).read_text())
    period = cfg["period"]
    assert period.endswith("s") and cfg["neuron_runtimes"][0]["metrics"], cfg
    if os.environ.get("FAKE_NEURON_MONITOR_MODE") == "garbage":
        print('{"neuron_runtime_data": [{"pid": 1, "rep', flush=True)
        print("neuron-monitor: failed to connect to the Neuron driver", file=sys.stderr, flush=True)
        return 2
    lines = (Path(__file__).parent / "trn_samples.jsonl").read_text().splitlines()
    i = 0
    while True:
        print(lines[i % len(lines)], flush=True)
        i += 1
        time.sleep(float(period[:-1]))


if __name__ == "__main__":
    sys.exit(main())
