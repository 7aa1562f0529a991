"""Artifacts of every kind and size made where stoker forks around them (tests/integration/test_fork_safety.py).

IncludeFiles (read and hashed by the run's process before it forks its tasks) and a large Parameter default;
bytes, str, numpy arrays, a pickled container and a torch tensor made in tasks; a step with @card, one with @monitor
that runs torch's thread pool; every step checks every artifact it inherited against the digests `start` recorded.
`$FORK_FLOW_DIR` holds the files `inc_<size>.bin` of `$FORK_FLOW_SIZES` (default: all of SIZES) and
`$FORK_FLOW_FAIL_END=1` makes `end` fail once so that `resume` clones the rest and reads it again.
"""

import hashlib
import os
import pickle

import numpy as np

from stoker import FlowSpec, IncludeFile, Parameter, card, current, monitor, step

SIZES = {"0B": 0, "1KB": 1 << 10, "300KB": 300 << 10, "8MB": 8 << 20, "64MB": 64 << 20}
USED = [s for s in os.environ.get("FORK_FLOW_SIZES", ",".join(SIZES)).split(",") if s]
DIR = os.environ.get("FORK_FLOW_DIR", ".")


def digest(value) -> str:
    if isinstance(value, np.ndarray):
        value = value.tobytes()
    elif isinstance(value, str):
        value = value.encode()
    elif not isinstance(value, bytes | bytearray):
        value = pickle.dumps(value, protocol=5)
    return hashlib.sha256(value).hexdigest()


def make(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).bytes(size)


class ForkSafetyFlow(FlowSpec):
    note = Parameter("note", type=str, default="p" * (1 << 20))  # 1 MB, stored by the run's process

    @step
    def start(self):
        self.expected = {}
        for s in USED:
            inc = getattr(self, f"inc_{s}")
            assert len(inc) == SIZES[s], (s, len(inc))
            assert inc == make(SIZES[s], SIZES[s]), f"IncludeFile inc_{s} differs from its file"
            self._keep(f"bytes_{s}", make(SIZES[s], SIZES[s] + 1))
            if SIZES[s] <= 8 << 20:  # the largest size as bytes and as an IncludeFile only: the test's time budget
                self._keep(f"str_{s}", "s" * SIZES[s])
                self._keep(f"array_{s}", np.frombuffer(make(SIZES[s] - SIZES[s] % 8, 7), dtype=np.float64).copy())
        self._keep("pickled", {"rows": [np.arange(1000) * i for i in range(40)], "name": "pickled", "n": 40})
        self._keep("small", 42)
        self.next(self.carded, self.monitored)

    def _keep(self, name, value):
        setattr(self, name, value)
        self.expected[name] = digest(value)

    def check(self, where):
        for name, want in self.expected.items():
            assert digest(getattr(self, name)) == want, f"{where}: artifact {name} changed"
        for s in USED:
            assert len(getattr(self, f"inc_{s}")) == SIZES[s]
        assert self.note == "p" * (1 << 20)
        print(f"fork_safety_flow: {where} checked {len(self.expected)} artifacts", flush=True)

    @card
    @step
    def carded(self):
        self.check("carded")
        self.next(self.join)

    @monitor(interval=0.2)
    @step
    def monitored(self):
        import torch

        a = torch.rand(600, 600)
        self.tensor = (a @ a).contiguous()  # torch's intra-op thread pool runs in this task
        self.tensor_sum = float(self.tensor.sum())
        self.check("monitored")
        self.next(self.join)

    @step
    def join(self, inputs):
        self.merge_artifacts(inputs)
        self.check("join")
        self.next(self.end)

    @step
    def end(self):
        self.check("end")
        assert abs(float(self.tensor.sum()) - self.tensor_sum) <= 1e-3 * abs(self.tensor_sum), "tensor changed"
        if os.environ.get("FORK_FLOW_FAIL_END") == "1":
            raise RuntimeError("end fails on purpose (the test resumes the run)")
        print(f"fork_safety_flow: done in run {current.run_id}", flush=True)


for _s in USED:  # one IncludeFile per size, read (and hashed) by the run's process before it forks
    setattr(ForkSafetyFlow, f"inc_{_s}", IncludeFile(f"inc_{_s}", is_text=False,
                                                    default=os.path.join(DIR, f"inc_{_s}.bin")))

if __name__ == "__main__":
    ForkSafetyFlow()
