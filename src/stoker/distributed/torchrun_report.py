"""torchrun's stderr on its way to the task's log: copied line by line as it comes, except torchrun's own report
of its workers' end, which waits until it is known whether that end was expected.

When its workers exit non-zero torchrun logs ``failed (exitcode: N)`` and raises ``ChildFailedError`` (a traceback
and a table of every rank); sent SIGTERM itself it logs ``Received 15 death signal`` and raises ``SignalException``.
For a preemption -- every worker committed a checkpoint and exited 75, each saying so in one line -- that is four
tracebacks' worth of noise in the live log of a two-node gang (with the task's own): this filter holds torchrun's
report from its first line and, for an expected stop, drops it (one line says so), else writes it as it was.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
from typing import IO

from stoker.errors import EXIT_PREEMPTED
from stoker.exitstatus import read_statuses

# the first line of torchrun's report: the agent's log line for a failed worker, a signal to itself, or its stopping
# the other workers once one ended
_REPORT_STARTS = re.compile(r"torch/distributed/elastic/.*\] (failed \(exitcode: -?\d+\)|Received \d+ death signal"
                            r"|Sending process \d+ closing signal)")
# what a worker of an expected stop exits with: 75, or SIGTERM when torchrun stopped it after it said 75
_STOP_CODES = {EXIT_PREEMPTED, -signal.SIGTERM}
_TRACEBACK = "Traceback (most recent call last):"
# after every worker of this node succeeded, torchrun waits for the other nodes' launchers at its exit barrier on the
# main node's store; when that node's launcher leaves first (its store closes), this one logs the error with its C++
# stack, though the gang succeeded (pytorch/pytorch#69520): held like the report above, dropped when torchrun exits 0
_EXIT_BARRIER = re.compile(r"torch/distributed/elastic/.*\] Error waiting on exit barrier")
_EXIT_CODES = re.compile(r"(?:failed \(exitcode: |exitcode\s*:\s*)(-?\d+)")


def preempted(status_dir: str | os.PathLike) -> bool:
    """Whether the workers that reported their end (``$STOKER_EXIT_STATUS_DIR``) all stopped for a preemption."""
    statuses = read_statuses(status_dir)
    return bool(statuses) and all(s.get("code") == EXIT_PREEMPTED for s in statuses)


class TorchrunStderr:
    """Pump torchrun's stderr (``pipe``, bytes) to ``out`` in a thread; :meth:`finish` after torchrun exited."""

    def __init__(self, pipe: IO[bytes], out: IO[str] | None = None) -> None:
        self.pipe, self.out = pipe, out if out is not None else sys.stderr
        self.held: list[str] = []
        self.codes: set[int] = set()  # the exit codes torchrun's report named (finish)
        self.thread = threading.Thread(target=self._pump, name="torchrun-stderr", daemon=True)
        self.thread.start()

    def _write(self, text: str) -> None:
        try:
            self.out.write(text)
            self.out.flush()
        except (OSError, ValueError):  # the log went away: torchrun must not block on a full pipe
            pass

    def _pump(self) -> None:
        for raw in iter(self.pipe.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            if self.held or _REPORT_STARTS.search(line) or _EXIT_BARRIER.search(line):
                self.held.append(line)
            else:
                self._write(line)
        self.pipe.close()

    def finish(self, preempted: bool, node: int | str = 0, succeeded: bool = False) -> None:
        """Write what was held, unless the workers' end was an expected stop: ``preempted`` (every worker that
        reported said 75) and every exit code torchrun's report names is 75 (or SIGTERM: torchrun stopped a worker
        that had said 75 once another one ended). Then only the lines that are not
        torchrun's (its log lines, its traceback to the end) are kept, and one line replaces the rest. `succeeded`
        (torchrun exited 0): an exit barrier's error is not shown."""
        self.thread.join(timeout=30)
        held, self.held = self.held, []
        self.codes = {int(c) for c in _EXIT_CODES.findall("".join(held))}  # this node's workers' exit codes
        if succeeded and held and _EXIT_BARRIER.search(held[0]):
            return  # every worker of the gang succeeded: the launchers' goodbye failed, which changes nothing
        codes = {int(c) for c in _EXIT_CODES.findall("".join(held))}
        if not held or not preempted or codes - _STOP_CODES:
            self._write("".join(held))
            return
        tb = max((i for i, line in enumerate(held) if line.rstrip("\n") == _TRACEBACK), default=len(held))
        kept = [line for line in held[:tb] if not re.search(r"torch/distributed/elastic/", line)]
        self._write("".join(kept) + f"torchrun: node {node}: every worker stopped after a preemption (exit code "
                                    f"{EXIT_PREEMPTED}, checkpoint committed); torchrun's failure report is not "
                                    "shown\n")
