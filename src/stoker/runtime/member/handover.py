"""A local member hands its finished manifest to the scheduler directly, so the scheduler need not read it back.

The store stays the truth: the member writes its signed manifest there first, as every task does. Then it sends
the very bytes it stored, as one packet, on a SOCK_SEQPACKET socket that the local backend made and that only the
run's own processes hold (forked members inherit it; nothing spawned or exec'd does). The scheduler so skips
reading the file and checking its signature -- what it gets comes from its own child -- and indexes the text as
it is. In a 10,000-way foreach of trivial tasks that was a fifth of the scheduler's CPU time.

Best effort by design: a manifest too large for one packet, or a scheduler that has not kept up (a full socket),
just means that this one is read from the store, as a remote task's always is.

Who hands over on which socket is set at the fork, not by an environment variable: a member claims the socket its
backend offered when it was forked (:func:`claim`); a run the member starts itself offers its own socket to its
own members, never to the member.
"""

from __future__ import annotations

import os
import socket

MAX_PACKET = 1 << 16  # larger manifests (thousands of artifacts) are read from the store
_offered = [-1]  # the socket members forked from this process will hand over on (set by a local backend)
_mine = [-1]  # the socket this process, a member, hands over on


def channel() -> tuple[socket.socket, int]:
    """A new channel: (the scheduler's end, non-blocking; the fd members write to). The caller offers the fd."""
    read, write = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    read.setblocking(False)
    return read, write.detach()


def offer(fd: int) -> None:
    """Members forked from now on (directly, or by a fork server forked from now on) hand over on ``fd``."""
    _offered[0] = fd


def claim() -> None:
    """In a member, right after its fork: take the offered socket as its own (and offer nothing further down)."""
    _mine[0], _offered[0] = _offered[0], -1


def hand_over(data: bytes, ok: bool = False) -> bool:
    """Send this member's stored manifest ``data`` to its scheduler; False when it could not (no channel, too
    large, the socket full): the scheduler then reads the manifest from the store. ``ok``: the attempt succeeded
    and nothing this process does from now on can change that (it only cleans up and exits): the scheduler may
    start what follows without waiting for the exit."""
    fd = _mine[0]
    if fd < 0 or len(data) > MAX_PACKET:
        return False
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=fd)
    try:
        sock.send(b"%d%s\n" % (os.getpid(), b"+" if ok else b"") + data, socket.MSG_DONTWAIT)
        return True
    except OSError:
        return False
    finally:
        sock.detach()  # the fd stays open: closing it is the process's exit


def receive(sock: socket.socket, into: dict[int, bytes], ok: set[int] | None = None) -> None:
    """Read every packet waiting on the scheduler's end into ``into`` (member pid -> manifest bytes); the pids of
    members that handed over a success (see :func:`hand_over`) into ``ok``."""
    while True:
        try:
            packet = sock.recv(MAX_PACKET + 32)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return
        if not packet:
            return
        pid, _, data = packet.partition(b"\n")
        succeeded = pid.endswith(b"+")
        pid = pid.rstrip(b"+")
        if pid.isdigit():
            into[int(pid)] = data
            if succeeded and ok is not None:
                ok.add(int(pid))
