"""A gang node's heartbeat: the node agent (runtime/member/node.py) rewrites one small object of its attempt,
`runs/<flow>/<run>/<step>/<task>/<attempt>/heartbeat.json`, every few seconds while it runs, and once more when it
ends (`"state": "ended"`, with its exit code). The driver (runtime/driver/lostnodes.py) reads them: a node whose
heartbeat stops while the others of its gang are alive, or have already failed, is lost (its host died, its engine
daemon was killed, the network cut it off), and the gang is stopped at once, naming it, instead of after the
engine's own node timeout (Slurm's SlurmdTimeout: 300 s by default).

Only the nodes of a gang beat (an array of a thousand tasks would write hundreds of objects a second otherwise).
The heartbeat is a thread of the node agent; the step runs in the same process, but its heavy work runs in torchrun's
workers or in code that releases the GIL, so a thread that wakes every two seconds is not starved.

`$STOKER_HEARTBEAT_TIMEOUT` (seconds) is how long the driver waits for a silent node: by default 6 with a store in a
folder (a cluster's shared filesystem), 20 with an object store (an S3 write can stall for seconds). A node beats
every 2 s (three times within the timeout when it is shorter); a node of a gang with hot spares every 0.5 s when the
store is a folder (its beat says so), since a lost node costs the gang only its detection and a restart.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

from stoker.store.manifest import attempt_prefix

TIMEOUT_ENV = "STOKER_HEARTBEAT_TIMEOUT"
SPARES_BEAT_S = 0.5  # a gang with hot spares, with its store in a folder: seconds between two beats
DEFAULT_TIMEOUT_S = 6.0
OBJECT_STORE_TIMEOUT_S = 20.0


def heartbeat_timeout(env: dict[str, str] | None = None, object_store: bool = False) -> float:
    """`$STOKER_HEARTBEAT_TIMEOUT` in seconds (at least 1; default 6, or 20 with an object store)."""
    default = OBJECT_STORE_TIMEOUT_S if object_store else DEFAULT_TIMEOUT_S
    raw = (os.environ if env is None else env).get(TIMEOUT_ENV, "")
    try:
        return max(1.0, float(raw)) if raw.strip() else default
    except ValueError:
        return default


def beat_interval(timeout: float | None = None) -> float:
    """Seconds between two beats: a third of the timeout, at most 2."""
    return min(2.0, max(0.2, (heartbeat_timeout() if timeout is None else timeout) / 3))


def heartbeat_name(flow: str, run_id: str, step: str, task_id: str, attempt: int) -> str:
    """The object a node of a gang beats in (one per task attempt, as its manifest and logs)."""
    return attempt_prefix(flow, run_id, step, task_id, attempt) + "heartbeat.json"


class Heartbeat:
    """Rewrites the heartbeat object every `interval` s from a daemon thread once `start`ed; `stop(code)` writes the
    last one (`ended`). Best effort: a failed write is said once on stderr and tried again at the next beat."""

    def __init__(self, interval: float | None = None) -> None:
        self.interval = interval
        self.store: Any = None
        self.name = ""
        self.doc: dict[str, Any] = {}
        self.seq = 0
        self.failed = False
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def start(self, store: Any, spec: Any, host: str = "") -> None:
        """Beat for `spec` (a TaskSpec) if it is a node of a gang of more than one; else do nothing."""
        par = spec.parallel
        if par is None or par.num_nodes < 2 or self.thread is not None:
            return
        self.store = store
        self.name = heartbeat_name(spec.flow, spec.run_id, spec.step, spec.task_id, spec.attempt)
        self.doc = {"node": par.node_index, "host": host or os.uname().nodename, "pid": os.getpid(),
                    "started_at": time.time(), "state": "running"}
        if par.member is not None:  # a gang with spares: which member beats for this node now
            self.doc["member"] = par.member
        self.interval = self.interval or beat_interval()
        if getattr(par, "spares", 0) and getattr(store, "root", None) is not None:
            # a gang with spares on a shared folder: beat faster, so a lost node is replaced sooner (two missed beats
            # prove it once a survivor said its torchrun failed: runtime/driver/lostnodes.py)
            self.interval = min(self.interval, SPARES_BEAT_S)
            self.doc["interval"] = self.interval
        self._beat()
        self.thread = threading.Thread(target=self._loop, name="stoker-heartbeat", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.done.wait(self.interval):
            self._beat()

    def _beat(self, **last: Any) -> None:
        with self.lock:  # the thread and stop() never write at once (the ended one must be the last)
            if self.done.is_set() and not last:
                return
            self.seq += 1
            doc = {**self.doc, **last, "seq": self.seq, "at": time.time()}
            try:
                self.store.write(self.name, json.dumps(doc).encode(), durable=False)
                self.failed = False
            except Exception as e:  # noqa: BLE001 - best effort; the driver judges a silent node
                if not self.failed:
                    print(f"stoker: heartbeat write failed ({e}); trying again", file=sys.stderr, flush=True)
                self.failed = True

    def stop(self, code: int) -> None:
        """The last beat: this node has ended (its task's manifest, if it wrote one, is in the store)."""
        if self.thread is None:
            return
        self.done.set()
        self._beat(state="ended", code=code)
        self.thread.join(timeout=1)
