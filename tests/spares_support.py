"""What the hot-spare tests (tests/integration/test_spares*.py) and benchmarks/recovery.py share: the token file the
gang trains on, `spares_flow.py run` in the background with every output line timed, the weights of a checkpoint
folder's newest checkpoint, killing a process tree at once, and the Slurm node that runs a member of a job."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

FLOW = Path(__file__).resolve().parent / "flows" / "spares_flow.py"


def tokens(folder: Path) -> Path:
    """A small uint16 token file (64 blocks of 33) of repeated rolled sequences: a loss that falls in a few steps."""
    import numpy as np

    rng = np.random.default_rng(1)
    base = rng.integers(0, 256, size=97)
    path = folder / "tokens.bin"
    np.concatenate([np.roll(base, i % 5) for i in range(22)]).astype(np.uint16).tofile(path)
    return path


def committed(ckpt: Path) -> int:
    """The step of the newest committed checkpoint in `ckpt` (-1: none yet)."""
    try:
        return int((ckpt / "latest").read_text().strip().rsplit("_", 1)[1])
    except (OSError, ValueError, IndexError):
        return -1


def final_weights(ckpt: Path) -> dict[str, Any]:
    """The model of the newest committed checkpoint in `ckpt`, loaded into one process (it reshards to full tensors,
    as tests/unit/train/test_parallel.py::load_weights does)."""
    import torch.distributed.checkpoint as dcp

    from stoker.train.model import Llama
    from stoker.train.settings import get_model_config

    model = Llama(get_model_config("tiny"))
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=str(ckpt / (ckpt / "latest").read_text().strip()))
    return state["model"]


def kill_tree(pid: int) -> None:
    """SIGKILL a process and everything under it at once (its torchrun agent and workers), as a host that dies: all
    are stopped first, so none reacts to the others' deaths."""
    import psutil

    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    for p in procs:
        p.send_signal(signal.SIGSTOP)
    for p in procs:
        p.send_signal(signal.SIGKILL)


def slurm_node_of(job: str, member: int, timeout: float = 30) -> str:
    """The Slurm node that runs member `member` (its SLURM_NODEID) of job `job`, from the processes' environments."""
    deadline = time.time() + timeout
    while True:
        for d in Path("/proc").iterdir():
            try:
                env = dict(v.split("=", 1) for v in (d / "environ").read_bytes().decode().split("\0") if "=" in v)
            except (OSError, UnicodeDecodeError):
                continue
            if env.get("SLURM_JOB_ID") == job and env.get("SLURM_NODEID") == str(member) and "SLURMD_NODENAME" in env:
                return env["SLURMD_NODENAME"]
        if time.time() > deadline:
            raise AssertionError(f"no process of member {member} of Slurm job {job}")
        time.sleep(0.2)


class FlowRun:
    """A flow command in the background, its output (stdout and stderr) line by line with the time each arrived."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str] | None = None, log: Path | None = None) -> None:
        self.proc = subprocess.Popen(args, cwd=cwd, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.log = log  # where finish() writes the whole output (assertion messages cut it short)
        self.lines: list[tuple[float, str]] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            self.lines.append((time.time(), line.rstrip("\n")))

    @property
    def text(self) -> str:
        return "\n".join(ln for _, ln in self.lines)

    def wait_at(self, pattern: str, timeout: float = 300, after: float = 0.0) -> tuple[float, re.Match]:
        """The first line matching `pattern` that arrived after `after`: when, and the match."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            for t, ln in list(self.lines):
                if t >= after and (m := re.search(pattern, ln)):
                    return t, m
            if self.proc.poll() is not None and not self.thread.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"no {pattern!r} in the output:\n{self.text[-6000:]}")

    def wait_for(self, pattern: str, timeout: float = 300, after: float = 0.0) -> re.Match:
        return self.wait_at(pattern, timeout, after)[1]

    def first(self, text: str, after: float = 0.0) -> float | None:
        """When the first line holding `text` arrived after `after`, if one did."""
        return next((t for t, ln in list(self.lines) if t > after and text in ln), None)

    def finish(self, timeout: float = 600) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.thread.join(timeout=5)
            if self.log is not None:
                self.log.write_text(self.text + "\n")


def spares_run(cwd: Path, data: Path, ckpt: Path, *args: str, steps: int, env: dict[str, str] | None = None,
               log: Path | None = None) -> FlowRun:
    """`spares_flow.py run --data DATA --steps N --ckpt CKPT [ARGS]` in the background."""
    return FlowRun([sys.executable, "-u", str(FLOW), "run", "--data", str(data), "--steps", str(steps), "--ckpt",
                    str(ckpt), *args], cwd, env, log)


STEPS = 100  # every hot-spare test trains this long: one uninterrupted reference serves them all
_REFERENCE: dict[int, Any] = {}


def reference_weights(steps: int = STEPS) -> tuple[Path, Any]:
    """The token file and the final weights of one uninterrupted run of the 2-node gang on the local backend (its
    spare never used), made once per test process: a gang with the same ranks on this host gives bitwise the same
    weights on any backend, so every interrupted run is compared with it."""
    if steps not in _REFERENCE:
        import tempfile

        tmp = Path(tempfile.mkdtemp(prefix="stoker-spares-reference-"))
        data = tokens(tmp)
        run = spares_run(tmp, data, tmp / "ckpt", steps=steps,
                         env={"STOKER_HOME": str(tmp / "home"), "STOKER_STORE": "", "STOKER_PREFLIGHT": "0"})
        assert run.finish() == 0, run.text[-6000:]
        _REFERENCE[steps] = (data, final_weights(tmp / "ckpt"))
    return _REFERENCE[steps]
