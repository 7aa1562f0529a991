"""Issue 25: a gang whose workers all succeeded is quiet. torchrun's exit barrier waits on the main node's store;
when that node's launcher has already left, this one logs "Error waiting on exit barrier" with the C++ stack of the
store's DistNetworkError (pytorch/pytorch#69520), though torchrun exits 0. Held, and dropped on success."""

from __future__ import annotations

import io
import os

from stoker.distributed.torchrun_report import TorchrunStderr

WORKERS = "[default0]:result OK: node rank 1, world size 2, backend gloo\n"
BARRIER = (  # the shape torch 2.13's agent logs it in (logger.exception, with the C++ frames of the store error)
    "E1206 11:40:01.000000 4242 torch/distributed/elastic/agent/server/api.py:1008] Error waiting on exit barrier. "
    "Elapsed: 0.0123 seconds\n"
    "Traceback (most recent call last):\n"
    '  File "torch/distributed/elastic/agent/server/api.py", line 994, in _exit_barrier\n'
    "    store_util.barrier(\n"
    "torch.distributed.DistNetworkError: failed to recv, got 0 bytes\n"
    "Exception raised from recvBytes at /pytorch/torch/csrc/distributed/c10d/Utils.hpp:670 (most recent call first):\n"
    "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x98 (0x7f in libc10.so)\n"
    "frame #1: <unknown function> + 0x5ba8bfe (0x7f in libtorch_cpu.so)\n")


def _pump(text: str, succeeded: bool) -> str:
    r, w = os.pipe()
    out = io.StringIO()
    report = TorchrunStderr(os.fdopen(r, "rb"), out)
    with os.fdopen(w, "wb") as f:
        f.write(text.encode())
    report.finish(False, node=1, succeeded=succeeded)
    return out.getvalue()


def test_a_successful_gang_drops_the_exit_barrier_trace():
    assert _pump(WORKERS + BARRIER, succeeded=True) == WORKERS


def test_a_failed_torchrun_keeps_it():
    assert _pump(WORKERS + BARRIER, succeeded=False) == WORKERS + BARRIER
