"""Process-tree helpers shared by the runtime and the backends."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, NoReturn

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_PARENT_ONLY_FDS: set[int] = set()  # a forked member closes these: the reaper must see EOF when the run dies
_LIBC: list = []  # libc, loaded at the first use


def close_parent_only_fds() -> None:
    """In a process forked from the run: drop the run's end of the reaper's pipe."""
    for fd in _PARENT_ONLY_FDS:
        try:
            os.close(fd)
        except OSError:
            pass
    _PARENT_ONLY_FDS.clear()


def _prctl(option: int, arg: Any) -> None:
    """Linux's prctl(option, arg) on this process (libc loaded at the first call); a no-op elsewhere."""
    if sys.platform.startswith("linux"):
        try:
            if not _LIBC:
                _LIBC.append(ctypes.CDLL("libc.so.6", use_errno=True))
            _LIBC[0].prctl(option, arg, 0, 0, 0)
        except (OSError, AttributeError):
            pass


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to signal this process when its parent dies (no-op elsewhere)."""
    _prctl(_PR_SET_PDEATHSIG, sig)


def raise_open_files_limit() -> None:
    """Raise this process's open-files soft limit to its hard limit (its children inherit it): collective
    libraries (the Neuron runtime, libfabric, NCCL) open many files per rank, and container defaults of 1024
    run out; every AWS recipe runs `ulimit -n` first."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            pass


def set_process_name(name: str) -> None:
    """This process's name for `ps -o comm` and top (Linux: 15 characters; its arguments stay as they were)."""
    _prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]))


def kill_grace(env: dict[str, str] | None = None) -> float:
    """Seconds between SIGTERM and SIGKILL when stoker stops a task (`$STOKER_KILL_GRACE`, default 30): long
    enough for a training step to finish and its checkpoint to be committed."""
    env = os.environ if env is None else env
    try:
        return max(0.0, float(env.get("STOKER_KILL_GRACE", "30")))
    except ValueError:
        return 30.0


def signal_tree(pid: int, sig: int, tree: bool = True) -> None:
    """Signal a task's process group and (tree=True) every descendant: torchrun workers may start sessions
    of their own. After the task process has exited only its group is left to signal."""
    kids: list = []
    if tree:
        import psutil

        try:
            kids = psutil.Process(pid).children(recursive=True)
        except Exception:  # noqa: BLE001 - psutil.Error: already gone
            pass
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for k in kids:
        try:
            if os.getpgid(k.pid) != pid:  # once each: a second SIGTERM cuts torchrun's own shutdown short
                k.send_signal(sig)
        except Exception:  # noqa: BLE001 - psutil.Error, ProcessLookupError: already gone
            pass


def end_program(code: object) -> NoReturn:
    """End this process with ``code`` (a SystemExit's: None, a number, or a message printed on stderr with 1), as
    Python's exit does, without its teardown. Only for the process's own program: nothing may run after it."""
    import atexit

    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None and threading.current_thread() is threading.main_thread():
        shutdown()  # as Python's exit: threading's exit hooks (an executor's workers), then its non-daemon threads
    else:
        for t in threading.enumerate():
            if t is not threading.current_thread() and not t.daemon:
                t.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:
            code = code or 128 + 13  # a closed stdout: as SIGPIPE would
        except (OSError, ValueError, AttributeError):  # closed, or replaced by something without flush
            pass
    os._exit(code or 0)


# -- fork safety -------------------------------------------------------------------------------------------------
# stoker forks (the run's fork server and members, the reaper, the Slurm node agent, the warm launcher's ranks). A
# native thread pool alive in the parent does not exist in the child, and a library that believes it does waits for
# it forever. What is made safe here, for every fork of a process that imported this module (docs/fork-safety.md):
# an OpenMP runtime's pool (torch's intra-op threads) is released before the fork (omp_pause_resource_all), so
# parent and child each start a new one at their next parallel region. What cannot be made safe (CUDA initialized,
# a device runtime imported) is what unsafe_to_fork() names: each fork point then refuses or starts a new process.

DEVICE_RUNTIMES = ("torch_xla", "torch_neuronx", "neuronx_distributed", "libneuronxla", "jax", "tensorflow")
_OPENMP = ("libgomp", "libiomp", "libomp")  # GNU's (torch's wheels), Intel's, LLVM's: each has omp_pause_resource_all
_openmp: dict[str, Any] = {}  # a loaded OpenMP runtime's path -> its handle
_modules_seen = [-1]  # len(sys.modules) when /proc/self/maps was last read for OpenMP runtimes
_OMP_PAUSE_HARD = 2


def _maps() -> str:
    try:
        with open("/proc/self/maps") as f:
            return f.read()
    except OSError:
        return ""


def _openmp_runtimes() -> list[Any]:
    """The OpenMP runtimes loaded in this process (read again only after an import: loading one takes an import)."""
    if len(sys.modules) != _modules_seen[0]:
        _modules_seen[0] = len(sys.modules)
        for line in _maps().splitlines():
            path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
            if os.path.basename(path).startswith(_OPENMP) and path not in _openmp:
                try:  # RTLD_NOLOAD: a handle on the copy already loaded, never a second one
                    _openmp[path] = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY).omp_pause_resource_all
                except (OSError, AttributeError):
                    _openmp[path] = None
    return [f for f in _openmp.values() if f is not None]


def release_native_pools() -> None:
    """Stop the OpenMP thread pools of this process (torch's intra-op threads): run before every fork. A child of a
    process whose GNU OpenMP pool had run waits forever at its first parallel region (torch 2.x on CPU); after a
    pause each process starts its own pool at its next parallel region (microseconds)."""
    if not sys.platform.startswith("linux"):
        return
    for pause in _openmp_runtimes():
        try:
            pause(_OMP_PAUSE_HARD)
        except Exception:  # noqa: BLE001 - a runtime that cannot pause: unsafe_to_fork() still sees its threads
            pass


def python_threads() -> list[str]:
    """The names of this process's other live Python threads (a forked child has none of them)."""
    me = threading.current_thread()
    return [t.name for t in threading.enumerate() if t is not me and t.is_alive()]


def native_threads() -> int:
    """Threads of this process (Python's and native ones: BLAS, OpenMP, rayon pools), from /proc/self/task."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def cuda_initialized() -> bool:
    """Whether the CUDA driver is loaded here: a CUDA call was made (`torch.cuda.is_available()` is one), after
    which a forked child cannot use CUDA (torch refuses, the driver fails its initialization)."""
    return "libcuda.so" in _maps()


def unsafe_to_fork(runtimes: tuple[str, ...] = DEVICE_RUNTIMES, max_threads: int | None = None) -> str:
    """Why a child forked from this process now would fail or hang ("" when it would not): a device runtime
    imported (its threads and handles are not in the child), CUDA initialized, and with ``max_threads`` more threads
    than that (Python's and native ones, counted after the OpenMP pools are released)."""
    if found := sorted({m.split(".")[0] for m in sys.modules} & set(runtimes)):
        return f"{', '.join(found)} imported"
    if cuda_initialized():
        return "CUDA initialized"
    if max_threads is not None:
        release_native_pools()
        if (n := native_threads()) > max_threads:
            names = python_threads()
            return f"{n} threads" + (f" (Python's: {', '.join(names)})" if names else "")
    return ""


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=release_native_pools)


class Reaper:
    """Kills a run's local task processes if the run process dies without stopping them (kill -9, a crash).

    PR_SET_PDEATHSIG only sends SIGTERM, which a step may ignore or outlive (a hung collective, a child of its
    own). The reaper is a small process in its own session, told each member's pid through a pipe. When that
    pipe closes without "done" (the run process is gone, however it ended), it sends SIGTERM to every member's
    process group and descendants, and SIGKILL to whatever is left after `grace` seconds.

    It is forked from the run (where fork exists), not started as a new interpreter: a new Python's start-up was
    ~20 ms of CPU on the run's other core while the first task started, a tenth of a short flow's wall time. The
    forked reaper keeps nothing of the run but the pipe (every other descriptor closed, the signals at their
    defaults) and never returns into the run's code."""

    def __init__(self, grace: float) -> None:
        self.returncode: int | None = None
        if not hasattr(os, "fork"):
            import subprocess

            self.proc: Any = subprocess.Popen(_reaper_command(grace), stdin=subprocess.PIPE,
                                              stdout=subprocess.DEVNULL, start_new_session=True)
            self.stdin: Any = self.proc.stdin
        else:
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the reaper: it ends with os._exit
                _forked_reaper(r, grace)
            os.close(r)
            self.proc = None
            self.pid, self.stdin = pid, os.fdopen(w, "wb")
        _PARENT_ONLY_FDS.add(self.stdin.fileno())
        self._pending: list[int] = []

    def watch(self, pid: int) -> None:
        """Add ``pid`` to what the reaper kills; it is told at the next :meth:`flush` (a pipe write per task costs
        more than the task's own bookkeeping in a wide foreach; until then PR_SET_PDEATHSIG covers the member)."""
        self._pending.append(pid)

    def flush(self) -> None:
        """Tell the reaper the pids watched since the last flush, in one write."""
        if self._pending:
            pids, self._pending = self._pending, []
            self._say("".join(f"{p}\n" for p in pids))

    def done(self, wait: bool = True) -> None:
        """The run stopped its members itself: the reaper exits (`wait=False`: told, not waited for; `join`)."""
        if self.stdin.closed:
            return self.join() if wait else None
        self._pending = []
        self._say("done\n")
        _PARENT_ONLY_FDS.discard(self.stdin.fileno())
        try:
            self.stdin.close()
        except Exception:  # noqa: BLE001 - it exits on its own at EOF
            pass
        if wait:
            self.join()
        return None

    def join(self, timeout: float = 5.0) -> None:
        """Wait for it to exit; timeout 0: do not wait (a short run's reaper may still be starting), reap it on a
        daemon thread (no zombie is left in a process that goes on)."""
        if self.proc is not None:
            wait: Any = self.proc.wait
        else:
            def wait(timeout: float | None = None) -> None:
                deadline = None if timeout is None else time.monotonic() + timeout
                while self.returncode is None:
                    try:
                        pid, status = os.waitpid(self.pid, os.WNOHANG if deadline is not None else 0)
                    except ChildProcessError:
                        self.returncode = 0  # reaped elsewhere
                        return
                    if pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
                    elif time.monotonic() >= deadline:  # type: ignore[operator]
                        return
                    else:
                        time.sleep(0.002)
        try:
            if timeout > 0:
                wait(timeout=timeout)
            else:
                threading.Thread(target=wait, name="reap-reaper", daemon=True).start()
        except Exception:  # noqa: BLE001 - it exits on its own at EOF
            pass
        if self.proc is not None:
            self.returncode = self.proc.returncode

    def _say(self, line: str) -> None:
        try:
            self.stdin.write(line.encode())
            self.stdin.flush()
        except (OSError, ValueError):
            pass


def _forked_reaper(r: int, grace: float) -> NoReturn:
    """The child side of Reaper: its own session, the pipe as stdin, /dev/null for stdout and stderr, nothing else
    of the run open (a parent reading the run's output must see it end when the run does), default signals."""
    code = 0
    try:
        os.setsid()
        set_process_name("stoker-reaper")  # its args are the run's
        os.dup2(r, 0)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.closerange(3, _max_fd())
        for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM):
            signal.signal(sig, signal.SIG_DFL)
        _reap(grace, _fd_lines(0))
    except BaseException:  # noqa: BLE001 - nothing of the run may run here
        code = 1
    os._exit(code)


def _max_fd() -> int:
    try:
        return min(os.sysconf("SC_OPEN_MAX"), 1 << 20)
    except (ValueError, OSError):
        return 4096


def _fd_lines(fd: int) -> Iterator[str]:
    """Lines read from ``fd`` without Python's buffered files (whose locks another thread of the run may have held
    when it forked)."""
    rest = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except InterruptedError:
            continue
        if not chunk:
            break
        rest += chunk
        *lines, rest = rest.split(b"\n")
        for line in lines:
            yield line.decode("ascii", "replace")
    if rest:
        yield rest.decode("ascii", "replace")


def _reaper_command(grace: float) -> list[str]:
    """This file run as a script by an isolated interpreter without ``site`` (``-I -S``), given this process's
    module path to find psutil on: ~20 ms of start-up instead of ~100 ms for ``-m stoker._process`` (site's .pth
    files, then ``import stoker``), which a short run paid on its other core and again at its end, waiting for
    the reaper to exit."""
    here = os.path.abspath(__file__)
    if not os.path.isfile(here):  # (a zip or frozen install)
        return [sys.executable, "-m", "stoker._process", "--reap", str(grace)]
    return [sys.executable, "-I", "-S", here, "--reap", str(grace), os.pathsep.join(p for p in sys.path if p)]


def _reap(grace: float, lines: Iterable[str]) -> None:
    import psutil

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for the run, which stops its tasks in order
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    watched: dict[int, psutil.Process] = {}
    prune_at = 256
    for line in lines:
        line = line.strip()
        if line == "done":
            return
        try:
            watched[int(line)] = psutil.Process(int(line))  # remembers its start time: a reused pid is not it
        except (ValueError, psutil.Error):
            continue
        if len(watched) > prune_at:  # a long run's finished members
            watched = {p: proc for p, proc in watched.items() if proc.is_running()}
            prune_at = max(256, 2 * len(watched))
    procs: list[psutil.Process] = []
    for proc in watched.values():
        if not proc.is_running():
            continue
        try:
            procs += [proc, *proc.children(recursive=True)]
        except psutil.Error:
            pass
    for p in procs:  # once each (torchrun cuts its workers' grace short on a second SIGTERM)
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    for pid, proc in watched.items():  # stragglers that joined a member's group after the snapshot
        if proc in procs:
            signal_tree(pid, signal.SIGKILL, tree=False)


if __name__ == "__main__":
    try:  # internal: `python -m stoker._process --reap GRACE [PATH]`, started by the run
        grace = float(sys.argv[2]) if len(sys.argv) in (3, 4) and sys.argv[1] == "--reap" else None
    except ValueError:
        grace = None
    if grace is None:
        sys.exit("error: python -m stoker._process --reap GRACE_SECONDS [MODULE_PATH] (started by a run, not by hand)")
    if len(sys.argv) == 4:  # the run's module path, after this interpreter's own: psutil is on it
        sys.path += [p for p in sys.argv[3].split(os.pathsep) if p not in sys.path]
    _reap(grace, sys.stdin)
