"""A fork server for the local backend (STOKER_TASK_LAUNCH=forkserver).

Forking a member from the scheduler costs the kernel a copy of the scheduler's page tables and, afterwards, a
copy-on-write fault on every page the scheduler writes while the member still shares it: both grow with the
scheduler's memory, which grows with the run (~50 us per MB, most of a wide foreach's scheduler CPU). The fork
server is forked once, at the first member, while the scheduler is still small, and forks every member after
that: the member runs the same in-process entrypoint (the flow class, store and graph the server inherited).
Before it forks anything the server runs the backend's ``preload``: the imports every task makes on first use,
made once and inherited by every member.

Protocol (two socketpairs): the scheduler sends a request for one or more members -- an 8-byte length carrying
each member's stdout and stderr pipe write ends (SCM_RIGHTS), then the pickled ([(spec document, member env)],
the scheduler's os.environ) -- and waits for ``s PID PID ...``, one pid per member in order; the environment
travels only when it changed since the last request (None otherwise: it was most of a request's bytes and of
the server's unpickling). The members one scheduler pass starts go in one request. The server reaps its children and
reports ``x PID EXIT_CODE``; at the end (the request socket closed) it reports ``r CPU_SECONDS`` (its own user +
sys time) and exits. Replies are SOCK_SEQPACKET packets, one per message. The server ignores
SIGINT/SIGTERM/SIGHUP (the scheduler stops members itself, in order) and is SIGKILLed when the scheduler dies
(PR_SET_PDEATHSIG); its members then get their own SIGTERM, and the run's Reaper, which watches every member
pid, SIGKILLs what is left after the grace.
"""

from __future__ import annotations

import os
import pickle
import resource
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any

from stoker._environ import environ_copy
from stoker._process import _PARENT_ONLY_FDS, close_parent_only_fds, die_with_parent

_LEN = struct.Struct("!Q")
MAX_BATCH = 100  # members per request: 200 fds (the kernel takes up to 253 in one message)
_REPLY = 16 + 12 * MAX_BATCH  # the longest report: "s" and a pid per member
SERVER_CPU = [0.0]  # user + sys seconds of the fork servers this process closed (the benchmark adds it)


class ForkServerDied(RuntimeError):
    pass


def available() -> bool:
    return hasattr(os, "fork") and hasattr(socket, "send_fds") and hasattr(socket, "SOCK_SEQPACKET")


def reap_later(pid: int) -> None:
    """Reap child `pid`, which is exiting, on a short-lived daemon thread: the caller does not wait for it, and
    no zombie is left in a process that goes on (a run started from Python)."""
    def reap() -> None:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass

    threading.Thread(target=reap, name=f"reap-{pid}", daemon=True).start()


class ForkServer:
    """The scheduler's end: start members, collect their exit codes."""

    def __init__(self, run_member: Callable[[dict, dict[str, str], dict[str, str], tuple[int, int]], int],
                 preload: Callable[[], None] | None = None) -> None:
        """``preload``: run once in the server before it forks anything (the imports every member makes: made
        once, inherited by all, instead of once per member)."""
        req_a, req_b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        rep_a, rep_b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sys.stdout.flush()
        sys.stderr.flush()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the server
            code = 1
            try:
                req_a.close()
                rep_a.close()
                close_parent_only_fds()
                die_with_parent(signal.SIGKILL)
                if os.getppid() != parent:
                    os._exit(1)
                if preload is not None:
                    try:
                        preload()
                    except Exception:  # noqa: BLE001 - only a speed-up: each member then imports it, and fails there
                        pass
                code = _serve(run_member, req_b, rep_b)
            except BaseException:  # noqa: BLE001
                traceback.print_exc()
            finally:
                os._exit(code)
        req_b.close()
        rep_b.close()
        rep_a.setblocking(False)
        self.pid, self.req, self.rep = pid, req_a, rep_a
        self.codes: dict[int, int] = {}
        self.started: deque[list[int]] = deque()  # the pids of each request, in order
        self.alive = True
        self._environ: dict[str, str] | None = None  # the environment the server has

    def fileno(self) -> int:
        return self.rep.fileno()

    def start(self, doc: dict, env: dict[str, str], w_fds: tuple[int, int]) -> int:
        """Have the server fork a member writing to ``w_fds``; its pid."""
        return self.start_many([(doc, env, w_fds)])[0]

    def start_many(self, members: list[tuple[dict, dict[str, str], tuple[int, int]]]) -> list[int]:
        """Have the server fork members, each (spec document, member env, stdout/stderr write ends), in one
        request; their pids, in order."""
        pids: list[int] = []
        for i in range(0, len(members), MAX_BATCH):
            pids += self._request(members[i:i + MAX_BATCH])
        return pids

    def _request(self, members: list[tuple[dict, dict[str, str], tuple[int, int]]]) -> list[int]:
        environ = environ_copy()
        body = pickle.dumps(([(doc, env) for doc, env, _ in members], None if environ is self._environ else environ),
                            pickle.HIGHEST_PROTOCOL)
        self._environ = environ
        try:
            socket.send_fds(self.req, [_LEN.pack(len(body))], [fd for _, _, fds in members for fd in fds])
            self.req.sendall(body)
        except OSError as e:
            self.alive = False
            raise ForkServerDied(self._died(f"a request could not be sent ({e})")) from e
        while True:
            self.pump()
            if self.started:
                return self.started.popleft()
            if not self.alive:
                raise ForkServerDied(self._died("it closed its socket"))
            select.select([self.rep], [], [], 1.0)

    def pump(self) -> None:
        """Read the server's reports that have arrived (never blocks)."""
        while True:
            try:
                data = self.rep.recv(_REPLY)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.alive = False
                return
            kind, *rest = data.split()
            if kind == b"s":
                self.started.append([int(p) for p in rest])
            elif kind == b"x":
                self.codes[int(rest[0])] = int(rest[1])
            elif kind == b"r":
                SERVER_CPU[0] += float(rest[0])

    def exit_code(self, pid: int) -> int | None:
        code = self.codes.pop(pid, None)
        if code is None and not self.alive:
            return 1  # the server is gone: its members got SIGTERM and are not ours to wait for
        return code

    def close(self, timeout: float = 5.0) -> None:
        try:
            self.req.close()  # the server's end of file: it reports its CPU time and exits
        except OSError:
            pass
        deadline = time.time() + timeout
        while time.time() < deadline:
            if os.waitpid(self.pid, os.WNOHANG)[0]:
                break
            if self.alive:  # its report, then its end of file as it exits, wake this loop
                select.select([self.rep], [], [], 0.05)
                self.pump()
            else:  # it reported and closed its socket: it is exiting; reaped in the background, not waited for
                reap_later(self.pid)
                break
        else:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        self.pump()
        self.rep.close()

    def _died(self, how: str) -> str:
        return (f"the local fork server (pid {self.pid}) stopped answering: {how}. Run again; if it keeps "
                "happening, set STOKER_TASK_LAUNCH=fork to fork tasks from the scheduler instead")


def _serve(run_member: Callable[..., int], req: socket.socket, rep: socket.socket) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *a: None)
    rep.setblocking(False)
    _PARENT_ONLY_FDS.update({req.fileno(), rep.fileno(), wake_r, wake_w})  # a member closes these
    out: deque[bytes] = deque()  # reports the scheduler has not taken yet: the server never blocks on them
    last_environ: dict[str, str] = {}
    while True:
        ready, writable, _ = select.select([req, wake_r], [rep] if out else [], [])
        if wake_r in ready:
            try:
                while os.read(wake_r, 512):
                    pass
            except BlockingIOError:
                pass
        _reap(out)
        if req in ready:
            msg = _recv(req)
            if msg is None:  # the scheduler closed its end
                break
            (members, environ), fds = msg
            environ = last_environ = last_environ if environ is None else environ
            pids = []
            try:
                for i, (doc, env) in enumerate(members):
                    pids.append(run_member(doc, env, environ, (fds[2 * i], fds[2 * i + 1])))
            finally:
                for fd in fds:
                    os.close(fd)
            out.append(b"s" + b"".join(b" %d" % pid for pid in pids))
        _send(rep, out)
    r = resource.getrusage(resource.RUSAGE_SELF)
    out.append(b"r %.6f" % (r.ru_utime + r.ru_stime))
    rep.setblocking(True)
    _send(rep, out)
    return 0


def _reap(out: deque[bytes]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not pid:
            return
        out.append(b"x %d %d" % (pid, os.waitstatus_to_exitcode(status)))


def _send(rep: socket.socket, out: deque[bytes]) -> None:
    while out:
        try:
            rep.send(out[0])
        except BlockingIOError:
            return
        except OSError:  # the scheduler is gone (PR_SET_PDEATHSIG ends this process)
            out.clear()
            return
        out.popleft()


def _recv(req: socket.socket) -> tuple[Any, list[int]] | None:
    head, fds, _, _ = socket.recv_fds(req, _LEN.size, 2 * MAX_BATCH)
    if not head:
        return None
    while len(head) < _LEN.size:
        more = req.recv(_LEN.size - len(head))
        if not more:
            return None
        head += more
    (n,) = _LEN.unpack(head)
    body = bytearray()
    while len(body) < n:
        chunk = req.recv(min(n - len(body), 1 << 20))
        if not chunk:
            return None
        body += chunk
    return pickle.loads(body), fds
