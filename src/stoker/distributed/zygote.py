"""The warm launcher's process on a node of a gang with spares (its owner's side: distributed/warm.py).

    python -m stoker.distributed.zygote FD OWNER_PID   (FD: its end of a SOCK_SEQPACKET socket pair with its owner)

It imports what it is asked to (torch, and the installed modules the entrypoint imports) once, then forks a node's
ranks for each generation of the gang: a rank is a copy of a process that has already imported everything, so it
starts in milliseconds instead of the seconds a new Python takes to import torch. It starts no thread and never runs
a rank itself, so each fork copies one thread and a clean interpreter. The entrypoint's own modules (those next to
it, or in the working folder) are not imported here: they may read the rank's environment or arguments when
imported. When its imports left another thread running (a BLAS pool started at import), imported a device runtime
(an entrypoint's module importing torch_xla) or touched CUDA, forking is not safe: it then starts again as a bare
process (nothing imported, no device context held) and each rank starts a new Python instead (`exec`), as torchrun
would.

A rank is its own session (its process group is what is signalled, its DataLoader workers included), and ends as
`python script.py` ends: Python's own exit, its finalization included.

Messages are one JSON document each, both ways:
    owner -> {"op": "preload", "entry": {"module" | "script"}}
             <- {"op": "preloaded", "loaded", "failed", "s", "threads", "unsafe"}
    owner -> {"op": "fds"} with one rank's stdout and stderr as file descriptors (once per rank, before "launch")
    owner -> {"op": "launch", "env", "ranks": [{...}], "argv", "module" | "script", "cwd", "fresh"}
             <- {"op": "launched", "pids": [...], "fresh": bool} or {"op": "error", "error": "..."}
    owner -> {"op": "signal", "sig": 15}                    (every rank still running: its process group)
             <- {"op": "exit", "rank": i, "pid": p, "code": c}   (a rank ended: its exit code, -N for a signal)
A message too long for one datagram comes as {"op", "file"}: the rest is in that file, which it deletes.
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
from typing import Any

MAX_MSG = 1 << 20
# an entrypoint's `WARM_IMPORTS = ("pkg.mod", ...)`: modules it imports late (when its training starts), preloaded too
WARM_IMPORTS = "WARM_IMPORTS"
# imported in a rank, never in the zygote: they start the device runtime's threads, and a fork copies one thread
# (stoker._process.DEVICE_RUNTIMES, written out here: the zygote imports no stoker module before it preloads)
NOT_PRELOADED = ("torch_xla", "torch_neuronx", "neuronx_distributed", "libneuronxla", "jax", "tensorflow")


def _send(sock: socket.socket, doc: dict[str, Any]) -> None:
    sock.send(json.dumps(doc).encode())


def _threads() -> int:
    from stoker._process import native_threads

    return native_threads()


def unsafe_to_fork() -> str:
    """Why a fork of this process would not be a clean rank ("" when it would): a second thread, a device runtime
    imported along the way (by one of the entrypoint's own modules), CUDA touched (stoker._process's check)."""
    from stoker._process import unsafe_to_fork as check

    return check(NOT_PRELOADED, max_threads=1)


def _local(name: str, here: str) -> bool:
    """Whether top-level module `name` is the entrypoint's own: found in `here` (its folder, or the working folder)."""
    from importlib.machinery import PathFinder

    return PathFinder.find_spec(name, [here]) is not None


def _module_file(module: str) -> str | None:
    """The file `python -m module` runs, found without importing anything (not even its packages' __init__)."""
    from importlib.machinery import PathFinder
    from importlib.util import find_spec

    parts = module.split(".")
    try:
        spec = find_spec(parts[0])  # a top-level module is found, not imported
        for part in parts[1:]:
            if spec is None or not spec.submodule_search_locations:
                return None
            spec = PathFinder.find_spec(part, list(spec.submodule_search_locations))
        if spec is not None and spec.submodule_search_locations:  # a package: `python -m` runs its __main__
            spec = PathFinder.find_spec("__main__", list(spec.submodule_search_locations))
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None else None


def entry_imports(module: str | None, script: str | None, here: str | None = None) -> list[str]:
    """torch, and the installed modules the entrypoint's file imports (anywhere in it: a `main()` imports late) or
    names in its `WARM_IMPORTS` (what the code it calls imports late), found by reading it, not running it; relative
    imports, the entrypoint's own modules (in `here`: the folder a rank's
    `sys.path[0]` is) and the device runtimes (NOT_PRELOADED) left out."""
    import ast

    names = ["torch", "torch.distributed"]
    path = _module_file(module) if module else script
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
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", "") == WARM_IMPORTS for t in node.targets):
            names += _literal_names(node.value)
    seen: list[str] = []
    for n in names:
        top = n.split(".")[0]
        if n in seen or top in ("__main__", "__future__") or top in NOT_PRELOADED or (here and _local(top, here)):
            continue
        seen.append(n)
    return seen


def _literal_names(value: Any) -> list[str]:
    """The module names of a `WARM_IMPORTS = ("a.b", ...)` assignment (nothing when it is no literal of strings)."""
    import ast

    try:
        names = ast.literal_eval(value)
    except ValueError:
        return []
    return [n for n in names if isinstance(n, str)] if isinstance(names, (tuple, list)) else []


def _preload(entry: dict[str, Any]) -> dict[str, Any]:
    import importlib

    module, script = entry.get("module"), entry.get("script")
    here = os.getcwd() if module or not script else os.path.dirname(os.path.abspath(script))
    sys.path[0] = here  # as the rank's: `python -m` puts the working folder first, `python script.py` its folder
    t0, loaded, failed = time.monotonic(), [], {}
    for name in entry_imports(module, script, here):
        try:
            importlib.import_module(name)
            loaded.append(name)
        except BaseException as e:  # noqa: BLE001 - a module that fails here fails again in the rank, and says why
            failed[name] = f"{type(e).__name__}: {e}"
    return {"op": "preloaded", "loaded": loaded, "failed": failed, "s": round(time.monotonic() - t0, 3),
            "threads": _threads(), "unsafe": unsafe_to_fork()}


class BecomeRank(BaseException):
    """Raised in a forked child: unwinds the zygote's loop, then `main` runs the rank with nothing of it on the
    stack, and Python's own exit ends it."""

    def __init__(self, msg: dict[str, Any], i: int, fresh: bool) -> None:
        super().__init__(i)
        self.msg, self.i, self.fresh = msg, i, fresh

    def run(self) -> None:
        msg, i = self.msg, self.i
        env = {**msg["env"], **msg["ranks"][i]}
        cwd = msg.get("cwd") or os.getcwd()
        os.chdir(cwd)
        module, script, args = msg.get("module"), msg.get("script"), list(msg.get("argv") or [])
        if self.fresh:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execve(sys.executable, [sys.executable, *(["-m", module] if module else [script]), *args], env)
        from stoker._process import set_process_name

        set_process_name(f"stoker-rank{env.get('RANK', i)}")  # its arguments are the zygote's
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as in any Python: KeyboardInterrupt
        os.environ.clear()
        os.environ.update(env)
        if env.get("STOKER_STACKS_DIR"):  # `stoker stacks`, hang detection: this rank's stack file (rankstacks.py)
            from stoker.distributed._rankhook.stackhook import install

            install()
        import random

        random.seed()  # a new process's seeds, not a copy of the zygote's (torch's default seed is fixed anyway)
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        import runpy
        import types

        main = types.ModuleType("__main__")  # its own __main__ in sys.modules, as Python's, cleared at its exit
        sys.modules["__main__"] = main
        if module:
            sys.argv = [module, *args]
            sys.path[0] = cwd  # as `python -m`: the working folder first, argv[0] the module's file
            runpy._run_module_as_main(module, alter_argv=True)  # type: ignore[attr-defined]  # what `-m` runs
            return
        path = os.path.abspath(script)
        sys.argv = [script, *args]
        sys.path[0] = os.path.dirname(path)  # as `python script.py`
        if not os.path.isfile(path) or not path.endswith(".py"):  # a folder or a zip with a __main__.py
            runpy.run_path(path, run_name="__main__")
            return
        from importlib.machinery import SourceFileLoader

        main.__dict__.update(__file__=path, __loader__=SourceFileLoader("__main__", path), __cached__=None,
                             __builtins__=__builtins__)
        with open(path, "rb") as f:
            code = compile(f.read(), path, "exec", dont_inherit=True)
        exec(code, main.__dict__)


class Zygote:
    def __init__(self, sock: socket.socket, bare: bool = False) -> None:
        self.sock, self.bare = sock, bare
        self.live: dict[int, tuple[int, int]] = {}  # pidfd (or pid, without pidfds) -> (pid, local rank)
        self.fds: list[int] = []  # the next launch's ranks' stdout and stderr
        self.pidfds = hasattr(os, "pidfd_open")

    def launch(self, msg: dict[str, Any]) -> None:
        fds, self.fds = self.fds, []
        n = len(msg["ranks"])
        if len(fds) != 2 * n:
            for fd in fds:
                os.close(fd)
            _send(self.sock, {"op": "error", "error": f"{len(fds)} output descriptors for {n} ranks"})
            return
        fresh = self.bare or bool(msg.get("fresh")) or bool(unsafe_to_fork())
        pids: list[int] = []
        sys.stdout.flush()
        sys.stderr.flush()
        me = os.getpid()
        for i in range(n):
            try:
                pid = os.fork()
            except OSError as e:  # no memory, too many processes: none of this launch runs
                self.signal(signal.SIGKILL)
                for fd in fds:
                    os.close(fd)
                _send(self.sock, {"op": "error", "error": f"could not fork rank {i}: {e}"})
                return
            if pid == 0:
                self._child(me, msg, i, fds, fresh)
            pids.append(pid)
            self.live[os.pidfd_open(pid) if self.pidfds else pid] = (pid, i)
        for fd in fds:
            os.close(fd)
        _send(self.sock, {"op": "launched", "pids": pids, "fresh": fresh})

    def _child(self, zygote: int, msg: dict[str, Any], i: int, fds: list[int], fresh: bool) -> None:
        """In the forked child: its session, its death with the zygote, its stdin, stdout and stderr; then it
        unwinds the zygote's loop (BecomeRank) and `main` runs the rank."""
        try:
            from stoker._process import die_with_parent

            os.setsid()  # its own process group: a signal reaches what it starts too (DataLoader workers)
            die_with_parent(signal.SIGKILL)  # the zygote gone (its owner gone): no orphaned rank trains on
            if os.getppid() != zygote:
                os._exit(137)
            for sig in (signal.SIGTERM, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            self.sock.close()
            for fd in (self.live if self.pidfds else ()):  # the zygote's handles on the other ranks
                os.close(fd)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
            os.dup2(fds[2 * i], 1)
            os.dup2(fds[2 * i + 1], 2)
            for fd in fds:
                os.close(fd)
        except BaseException:  # noqa: BLE001 - nothing of the zygote's loop may run in a child
            os._exit(126)
        raise BecomeRank(msg, i, fresh)

    def signal(self, sig: int) -> None:
        for pid, _ in self.live.values():  # not reaped yet: the pid is still this rank's (and its group's id)
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass

    def reap(self, key: int) -> None:
        pid, i = self.live[key]
        done, status = os.waitpid(pid, 0 if self.pidfds else os.WNOHANG)
        if not done:
            return
        del self.live[key]
        if self.pidfds:
            os.close(key)
        _send(self.sock, {"op": "exit", "rank": i, "pid": pid, "code": os.waitstatus_to_exitcode(status)})

    def serve(self) -> None:
        while True:
            watched = list(self.live) if self.pidfds else []
            ready, _, _ = select.select([self.sock, *watched], [], [], None if self.pidfds or not self.live else 0.05)
            for key in (ready if self.pidfds else list(self.live)):
                if key in self.live:
                    self.reap(key)
            if self.sock not in ready:
                continue
            data, fds, flags, _ = socket.recv_fds(self.sock, MAX_MSG, 2)
            if not data:  # the owner is gone
                self.signal(signal.SIGKILL)
                return
            if flags & socket.MSG_CTRUNC:
                for fd in fds:
                    os.close(fd)
                _send(self.sock, {"op": "error", "error": "file descriptors were lost on the way"})
                continue
            msg = json.loads(data)
            if "file" in msg:  # too long for one message (a large environment): the owner wrote it to a file
                path = msg["file"]
                with open(path, "rb") as f:
                    msg = json.loads(f.read())
                os.unlink(path)
            self.handle(msg, fds)

    def handle(self, msg: dict[str, Any], fds: list[int]) -> None:
        op = msg["op"]
        if op == "fds":
            self.fds += fds
        elif op == "launch":
            self.launch(msg)
        elif op == "signal":
            self.signal(int(msg["sig"]))
        elif op == "preload" and self.bare:
            _send(self.sock, {"op": "preloaded", "loaded": [], "failed": {}, "s": 0.0, "threads": _threads(),
                              "unsafe": "bare"})
        elif op == "preload":
            reply = _preload(msg.get("entry") or {})
            _send(self.sock, reply)
            unsafe = reply["unsafe"]
            if unsafe and not unsafe.endswith("threads") and not self.live:
                # a device runtime or CUDA is held: start again with nothing imported (each rank starts anew)
                os.execv(sys.executable, [sys.executable, "-m", "stoker.distributed.zygote", *sys.argv[1:3],
                                          f"--bare={unsafe}"])


def main(argv: list[str]) -> None:
    try:
        sock = socket.socket(fileno=int(argv[0]))
        owner = int(argv[1])
        if sock.type != socket.SOCK_SEQPACKET:
            raise OSError("not a SOCK_SEQPACKET socket")
    except (IndexError, ValueError, OSError) as e:
        print(f"stoker.distributed.zygote: error: it takes the file descriptor of its socket to the warm launcher "
              f"and the launcher's pid, and the launcher starts it (distributed/warm.py): {e}", file=sys.stderr)
        raise SystemExit(2) from None
    from stoker._process import die_with_parent, raise_open_files_limit

    die_with_parent(signal.SIGKILL)  # it ignores SIGTERM: its owner's end ends it
    if os.getppid() != owner:
        os._exit(0)
    raise_open_files_limit()  # the ranks inherit it (collective libraries open many files)
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"  # torch.cuda.is_available() at import must not touch CUDA
    # a Ctrl-C, a cancel or a preemption (scancel signals every process of the step) is for the ranks, which
    # checkpoint and stop; this process ends with its owner (the socket's end, or SIGKILL when its owner dies)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    rank = None
    try:
        Zygote(sock, bare=any(a.startswith("--bare") for a in argv[2:])).serve()
    except BecomeRank as child:  # a forked child
        rank = child
        rank.__traceback__ = None  # (the zygote's frames)
    except (BrokenPipeError, ConnectionResetError):
        pass
    if rank is None:
        os._exit(0)
    rank.run()  # outside the handler: its errors are its own, and Python's own exit ends it


if __name__ == "__main__":
    main(sys.argv[1:])
