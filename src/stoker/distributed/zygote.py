"""The warm launcher's process on a node of a gang with spares (its owner's side: distributed/warm.py).

    python -m stoker.distributed.zygote FD      (FD: its end of a SOCK_SEQPACKET socket pair with its owner)

It imports what it is asked to (torch, the entrypoint's imports) once, then forks a node's ranks for each generation
of the gang: a rank is a copy of a process that has already imported everything, so it starts in milliseconds
instead of the seconds a new Python takes to import torch. It starts no thread and never runs a rank itself, so
each fork copies one thread and a clean interpreter. When its imports left another thread running (a BLAS pool
started at import), imported a device runtime (an entrypoint's own module importing torch_xla) or initialized CUDA,
forking is not safe: each rank then starts a new Python instead (`exec`), as torchrun would.

Messages are one JSON document each, both ways:
    owner -> {"op": "preload", "entry": {"module" | "script"}}
             <- {"op": "preloaded", "loaded", "failed", "s", "threads"}
    owner -> {"op": "launch", "env", "ranks": [{...}], "argv", "module" | "script", "cwd", "fresh"} (+ the stdout
             and stderr of each rank as file descriptors)
             <- {"op": "launched", "pids": [...], "fresh": bool}
    owner -> {"op": "signal", "sig": 15}                    (every rank still running)
             <- {"op": "exit", "rank": i, "pid": p, "code": c}   (a rank ended: its exit code, -N for a signal)
Its ranks die with it (SIGKILL); it dies with its owner (the socket's end: it kills its ranks and leaves).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import time
from typing import Any, NoReturn

MAX_MSG = 1 << 20


def _send(sock: socket.socket, doc: dict[str, Any]) -> None:
    sock.send(json.dumps(doc).encode())


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def unsafe_to_fork() -> str:
    """Why a fork of this process would not be a clean rank ("" when it would): a second thread, a device runtime
    imported along the way (by one of the entrypoint's own modules), CUDA initialized."""
    if (n := _threads()) > 1:
        return f"{n} threads"
    if runtimes := sorted({m.split(".")[0] for m in sys.modules} & set(NOT_PRELOADED)):
        return f"{', '.join(runtimes)} imported"
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and getattr(cuda, "is_initialized", lambda: False)():
        return "CUDA initialized"
    return ""


# imported in a rank, never in the zygote: they start the device runtime's threads, and a fork copies one thread
NOT_PRELOADED = ("torch_xla", "torch_neuronx", "neuronx_distributed", "libneuronxla", "jax", "tensorflow")


def entry_imports(module: str | None, script: str | None) -> list[str]:
    """torch, and every module the entrypoint's file imports (anywhere in it: a `main()` imports late), found by
    reading it, not running it; relative imports and the device runtimes (NOT_PRELOADED) left out."""
    import ast

    names = ["torch", "torch.distributed"]
    path = script
    if module:
        from importlib.util import find_spec

        try:
            spec = find_spec(module)
            if spec is not None and spec.submodule_search_locations:  # a package: `python -m` runs its __main__
                spec = find_spec(f"{module}.__main__")
            path = spec.origin if spec is not None else None
        except (ImportError, ValueError):
            path = None
    try:
        with open(path or "", "rb") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return names
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    seen: list[str] = []
    for n in names:
        if n not in seen and n != "__main__" and n.split(".")[0] not in NOT_PRELOADED:
            seen.append(n)
    return seen


def _preload(entry: dict[str, Any]) -> dict[str, Any]:
    import importlib

    t0, loaded, failed = time.monotonic(), [], {}
    for name in entry_imports(entry.get("module"), entry.get("script")):
        try:
            importlib.import_module(name)
            loaded.append(name)
        except BaseException as e:  # noqa: BLE001 - a module that fails here fails again in the rank, and says why
            failed[name] = f"{type(e).__name__}: {e}"
    return {"op": "preloaded", "loaded": loaded, "failed": failed, "s": round(time.monotonic() - t0, 3),
            "threads": _threads(), "unsafe": unsafe_to_fork()}


def _rank(sock: socket.socket, msg: dict[str, Any], i: int, fds: list[int], fresh: bool, others: list[int]) -> NoReturn:
    """In the forked child: become local rank `i` of the launch `msg` and run its entrypoint; never returns."""
    code: object = 1
    try:
        from stoker._process import die_with_parent, set_process_name

        die_with_parent(signal.SIGKILL)  # the zygote gone (its owner gone): no orphaned rank trains on
        set_process_name(f"stoker-rank{msg['ranks'][i].get('RANK', i)}")  # its arguments are the zygote's
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        sock.close()
        for fd in others:  # the zygote's handles on the other ranks
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        if fds:
            os.dup2(fds[2 * i], 1)
            os.dup2(fds[2 * i + 1], 2)
        for fd in fds:
            os.close(fd)
        env = {**msg["env"], **msg["ranks"][i]}
        cwd = msg.get("cwd") or os.getcwd()
        os.chdir(cwd)
        module, script, args = msg.get("module"), msg.get("script"), list(msg.get("argv") or [])
        if fresh:
            argv = [sys.executable, *(["-m", module] if module else [script]), *args]
            os.execve(sys.executable, argv, env)
        os.environ.clear()
        os.environ.update(env)
        import random

        random.seed()  # a new process's seeds, not a copy of the zygote's (torch's default seed is fixed anyway)
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        import runpy

        if module:
            sys.argv = [module, *args]
            sys.path[0] = cwd  # as `python -m`
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            path = os.path.abspath(script)
            sys.argv = [script, *args]
            sys.path[0] = os.path.dirname(path)  # as `python script.py`
            runpy.run_path(path, run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code
    except BaseException:  # noqa: BLE001 - as Python reports an uncaught exception
        import traceback

        traceback.print_exc()
        code = 1
    from stoker._process import end_program

    end_program(code)


class Zygote:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.live: dict[int, tuple[int, int]] = {}  # pidfd -> (pid, local rank)

    def launch(self, msg: dict[str, Any], fds: list[int]) -> None:
        fresh = bool(msg.get("fresh")) or bool(unsafe_to_fork())
        pids = []
        sys.stdout.flush()
        sys.stderr.flush()
        for i in range(len(msg["ranks"])):
            pid = os.fork()
            if pid == 0:
                _rank(self.sock, msg, i, fds, fresh, list(self.live))
            pids.append(pid)
            self.live[os.pidfd_open(pid)] = (pid, i)
        for fd in fds:
            os.close(fd)
        _send(self.sock, {"op": "launched", "pids": pids, "fresh": fresh})

    def signal(self, sig: int) -> None:
        for pid, _ in self.live.values():  # not reaped yet: the pid is still this rank's
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def reap(self, pidfd: int) -> None:
        pid, i = self.live.pop(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        _send(self.sock, {"op": "exit", "rank": i, "pid": pid, "code": os.waitstatus_to_exitcode(status)})

    def serve(self) -> None:
        while True:
            ready, _, _ = select.select([self.sock, *self.live], [], [])
            for fd in ready:
                if fd in self.live:
                    self.reap(fd)
            if self.sock not in ready:
                continue
            data, fds, _, _ = socket.recv_fds(self.sock, MAX_MSG, 64)
            if not data:  # the owner is gone
                self.signal(signal.SIGKILL)
                return
            msg = json.loads(data)
            if "file" in msg:  # too long for one message (a large environment): the owner wrote it to a file
                path = msg["file"]
                with open(path, "rb") as f:
                    msg = json.loads(f.read())
                os.unlink(path)
            if msg["op"] == "preload":
                _send(self.sock, _preload(msg.get("entry") or {}))
            elif msg["op"] == "launch":
                self.launch(msg, fds)
            elif msg["op"] == "signal":
                self.signal(int(msg["sig"]))


def main(argv: list[str]) -> None:
    try:
        sock = socket.socket(fileno=int(argv[0]))
        if sock.type != socket.SOCK_SEQPACKET:
            raise OSError("not a SOCK_SEQPACKET socket")
    except (IndexError, ValueError, OSError) as e:
        print(f"stoker.distributed.zygote: error: it takes the file descriptor of its socket to the warm launcher, "
              f"which starts it (distributed/warm.py): {e}", file=sys.stderr)
        raise SystemExit(2) from None
    # a Ctrl-C, a cancel or a preemption (scancel signals every process of the step) is for the ranks, which
    # checkpoint and stop; this process ends with its owner (the socket's end, or SIGKILL when its owner dies)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        Zygote(sock).serve()
    except (BrokenPipeError, ConnectionResetError):
        pass
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
