"""A task's watchdog: one daemon thread per task process that answers `stoker stacks` and stops a hung attempt.

Every process of the task (the task itself, torchrun, each rank, a warm launcher's forked ranks) installs the stack
hook (distributed/_rankhook/stackhook.py): the task puts its folder on its children's PYTHONPATH. Each process marks
its progress whenever it prints, and dumps its stacks on SIGUSR2.

Hang: an attempt whose processes print nothing for its hang timeout is hung. The watchdog prints the stacks of all its
processes into the task's log, keeps them with the attempt in the store (`stacks.txt`), raises `TaskHang` in the
step (a SIGUSR1 to the main thread, so @retry and @catch see it as any exception; the attempt's cause is `hang`)
and kills the ranks (a hung collective has nothing to save). A step that does not unwind within 15 s (stuck in C
code) ends the process with exit code 79 (`exitstatus.EXIT_HANG`, also cause `hang`).

The hang timeout: the step's `@timeout(hang=S)` (any task); else, for a gang node or a task that started ranks (a
process with $RANK), the run's `--hang-timeout` (default 1800 s: longer than a first compilation or a checkpoint
save that prints nothing, shorter than the 30 min gloo/NCCL timeouts it saves; 0 turns it off); a plain task has
none by default (a long silent step is normal there). Until a gang node's first rank starts, its limit is at least
60 s: its set-up (a warm launcher importing torch, staging) may print nothing for that long on a busy host.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

from stoker.distributed import rankstacks
from stoker.distributed._rankhook import stackhook
from stoker.exitstatus import EXIT_HANG, TaskHang
from stoker.runtime.member.stackreq import (
    REQUEST_TTL_S,
    answer_name,
    hang_stacks_name,
    in_scope,
    read_answers,
    request_name,
    write_request,
)

DEFAULT_GANG_HANG_S = 1800.0
STARTUP_MIN_S = 60.0  # a gang's hang timeout before its first rank starts, at least
FIRE_GRACE_S = 15.0  # after raising TaskHang in the step, how long before the process is ended (exit 79)
INTERRUPT = signal.SIGUSR1


class Watchdog:
    def __init__(self, store: Any, spec: Any, step_limit: float | None, folder: str) -> None:
        self.store, self.spec, self.folder = store, spec, folder
        self.step_limit = step_limit
        self.run_limit = DEFAULT_GANG_HANG_S if spec.hang_timeout_s is None else float(spec.hang_timeout_s)
        self.gang = spec.parallel is not None
        self.interval = 0.5 if getattr(store, "root", None) is not None else 5.0
        self.started = time.time()
        self.answered = ""
        self.fired = self.raised = False
        self.message = ""
        self.done = threading.Event()
        self.main = threading.main_thread().ident
        self.old_env = {k: os.environ.get(k) for k in (rankstacks.ENV, "PYTHONPATH")}
        self.old_handler: Any = None
        self.armed = False  # whether TaskHang can be raised in the main thread (a handler of ours is installed)
        self.thread: threading.Thread | None = None
        self.seen, self.ranks = 0, False  # hooked processes seen; whether one is a rank

    @classmethod
    def start(cls, store: Any, spec: Any, step_limit: float | None, tmp: str) -> Watchdog | None:
        """Install the hook in this process and its children-to-be, and start watching; None where it cannot."""
        folder = os.path.join(tmp, "stacks")
        try:
            os.makedirs(folder, exist_ok=True)
            self = cls(store, spec, step_limit, folder)
            os.environ.update(rankstacks.child_env(folder, os.environ))
            stackhook.install(folder)
            if threading.current_thread() is threading.main_thread():
                self.old_handler = signal.signal(INTERRUPT, self._on_interrupt)
                self.armed = True
        except (OSError, ValueError) as e:
            print(f"stoker: no stacks or hang detection for this task ({e})", file=sys.stderr, flush=True)
            return None
        self.thread = threading.Thread(target=self._loop, name="stoker-watchdog", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        """The step has ended: stop watching, restore what `start` changed."""
        self.raised = True  # a TaskHang fired just now must not break out of the task's own ending
        self.done.set()
        stackhook.uninstall()
        for k, v in self.old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if self.armed:
            signal.signal(INTERRUPT, self.old_handler if self.old_handler is not None else signal.SIG_DFL)

    # -- the thread -------------------------------------------------------------------------------
    def limit(self) -> tuple[float, str]:
        """(seconds, where it comes from) of this attempt's hang timeout; 0: none."""
        if not self.ranks:
            self.ranks = self._has_ranks()
        if self.step_limit:
            limit, source = self.step_limit, "the step's @timeout(hang=)"
        elif self.gang or self.ranks:
            self.gang = True
            limit, source = self.run_limit, ("the run's --hang-timeout" if self.spec.hang_timeout_s is not None
                                             else "the default for gangs")
        else:
            return 0.0, ""
        if self.gang and not self.ranks and limit:  # its set-up (imports, a warm launcher, staging) prints little
            return max(limit, STARTUP_MIN_S), f"{source}, at least {STARTUP_MIN_S:g} s before its ranks start"
        return limit, source

    def _has_ranks(self) -> bool:
        n = sum(1 for e in os.scandir(self.folder) if e.name.endswith(".stk"))
        if n == self.seen:
            return False
        self.seen = n
        return any(h.get("rank") not in (None, "") for h in rankstacks.hooked(self.folder).values())

    def _loop(self) -> None:
        while not self.done.wait(self.interval):
            try:
                self._answer()
                limit, source = self.limit()
                idle = time.time() - max(self.started, rankstacks.last_progress(self.folder))
                if limit and idle > limit and not self.fired:
                    self._fire(idle, limit, source)
                    if not self.done.wait(FIRE_GRACE_S):
                        print(f"stoker: the step did not stop within {FIRE_GRACE_S:.0f} s of TaskHang: ending the "
                              f"task (exit {EXIT_HANG})", file=sys.stderr, flush=True)
                        os._exit(EXIT_HANG)
            except Exception as e:  # noqa: BLE001 - the watchdog never ends a task by its own error
                print(f"stoker: watchdog: {type(e).__name__}: {e}", file=sys.stderr, flush=True)

    def _answer(self) -> None:
        s = self.spec
        try:
            req = json.loads(self.store.read(request_name(s.flow, s.run_id)))
        except Exception:  # noqa: BLE001 - no request (the usual case), or one half written
            return
        nonce = str(req.get("nonce") or "")
        if not nonce or nonce == self.answered:
            return
        self.answered = nonce
        if not in_scope(str(req.get("scope") or ""), s.step, s.task_id) or \
                time.time() - float(req.get("at") or 0) > REQUEST_TTL_S:
            return
        doc = {"task": s.pathspec, "attempt": s.attempt, "text": self.dump()}
        self.store.write(answer_name(s.flow, s.run_id, nonce, s.step, s.task_id, s.attempt),
                         json.dumps(doc).encode(), durable=False)

    def dump(self) -> str:
        """The stacks of every process of this attempt: the task's own threads (with their names), then each
        hooked child's (torchrun, the ranks in order), each under a `[FLOW/RUN/STEP/TASK rank R pid P host H]` line."""
        s, host, pid = self.spec, os.uname().nodename, os.getpid()
        where = s.pathspec + (f" attempt {s.attempt}" if s.attempt else "")
        me = rankstacks.ProcessStacks(pid, None, host, "task", rankstacks.own_stacks(threading.get_ident()))
        parts = [f"[{where} task pid {pid} host {host}]\n{me.text()}"]
        for p in rankstacks.collect(self.folder, skip={pid}):
            parts.append(f"[{where} {p.what} pid {p.pid} host {p.host}]\n{p.text()}")
        return "\n\n".join(parts) + "\n"

    def _fire(self, idle: float, limit: float, source: str) -> None:
        s = self.spec
        self.fired = True
        what = "the task or its ranks" if self.gang else "the task"
        msg = f"no progress for {idle:.0f} s (hang timeout {limit:g} s, {source}): nothing printed by {what}"
        text = self.dump()
        print(f"\nstoker: hang: {msg}; the stacks of its processes:\n{text}", file=sys.stderr, flush=True)
        text += self._gang_stacks()
        try:
            self.store.write(hang_stacks_name(s.flow, s.run_id, s.step, s.task_id, s.attempt), text.encode())
        except Exception as e:  # noqa: BLE001 - they are in the log too
            print(f"stoker: could not store the stacks ({e}); they are in the log above", file=sys.stderr, flush=True)
        self.message = f"{msg}; stacks: stoker logs {s.pathspec} --stacks"
        if self.armed:
            signal.pthread_kill(self.main, INTERRUPT)
        time.sleep(0.2)  # the step unwinds first (a torchrun wait ends on TaskHang, not on its ranks' deaths)
        hooked = rankstacks.hooked(self.folder)
        ranks = {p for p, h in hooked.items() if rankstacks.is_rank(h)}
        rankstacks.signal_all(self.folder, signal.SIGKILL, skip=(set(hooked) - ranks) | {os.getpid()})

    def _gang_stacks(self) -> str:
        """The other nodes' stacks of a gang of several nodes (asked through the store; a node that fires at the same
        time is answered meanwhile), so that the attempt's record shows the whole gang, not only this node."""
        s = self.spec
        if s.parallel is None or s.parallel.num_nodes < 2:
            return ""
        nonce, docs = write_request(self.store, s.flow, s.run_id, s.step), {}
        self.answered = nonce  # (not by this node: its stacks are above)
        deadline = time.monotonic() + 2 * self.interval + 2
        while time.monotonic() < deadline:
            self._answer()
            read_answers(self.store, s.flow, s.run_id, nonce, docs)
            if len({d.get("task") for d in docs.values()} - {s.pathspec}) >= s.parallel.num_nodes - 1:
                break
            time.sleep(0.2)
        return "".join(f"\n{d.get('text', '')}" for d in sorted(docs.values(), key=lambda d: d.get("task", ""))
                       if d.get("task") != s.pathspec)

    def _on_interrupt(self, signum: int, frame: Any) -> None:
        if self.fired and not self.raised:
            self.raised = True
            raise TaskHang(self.message)
