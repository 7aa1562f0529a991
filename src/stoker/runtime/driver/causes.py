"""Why an attempt failed: one cause per failed attempt, with its evidence, and what it means for the retries.

:func:`classify` is pure: it reads the attempt's manifest (its exception: type, message, traceback, the
``permanent`` / ``preempted`` flags), the engine's status (exit code, signal, ``JobStatus.reason``: Slurm's states,
Batch's statusReason), why stoker stopped it, and the tail of its log (the known patterns of NCCL/gloo timeouts, CUDA
and host OOM, Neuron runtime errors). It tries, in this order, and the first that matches wins:

1. what stoker and the engine know for certain: stoker stopped it (cancelled), it was cancelled outside stoker, it
   was preempted, it ran out of time, a deterministic error (exit code 78, ``ConfigError``, a request the engine can
   never start), the engine says out of memory or a node failed, a data/IO exception type, an untrusted manifest;
2. known patterns in the exception's text, then (when the exception says nothing specific, e.g. "torchrun exited
   with code 1" or a process that died) in the log's tail: out of memory, device/runtime failure, network or
   collective timeout, missing module, I/O error;
3. how the process ended: killed by a signal from outside (node lost / engine failure), else the step's own
   exception (user code error), or stoker's when no frame of the traceback is outside stoker.

docs/operations.md ("Why an attempt failed") is the table; tests/unit/runtime/test_causes.py tests it case by case.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from typing import Any

from stoker.errors import EXIT_PERMANENT, EXIT_PREEMPTED
from stoker.exitstatus import EXIT_HANG

USER, CONFIG, OOM, NODE, NETWORK = "user", "config", "oom", "node", "network"
PREEMPTION, TIME_LIMIT, DATA, STOKER, CANCELLED = "preemption", "time_limit", "data", "stoker", "cancelled"
HANG = "hang"  # no progress for the hang timeout: stopped by the task's watchdog (runtime/member/watchdog.py)
LABELS = {USER: "user code error", CONFIG: "configuration error", OOM: "out of memory",
          NODE: "node lost / engine failure", NETWORK: "network/collective timeout", PREEMPTION: "preemption",
          TIME_LIMIT: "time limit", DATA: "data/IO error", STOKER: "stoker's own error", CANCELLED: "cancelled",
          HANG: "hang (no progress)"}
# retry policies: never; under @retry (counted); under @retry unless it repeats identically; a preemption's own
NEVER, RETRY, UNLESS_REPEATED, PREEMPTED = "never", "retry", "unless_repeated", "preemption"
POLICY = {USER: UNLESS_REPEATED, CONFIG: NEVER, OOM: UNLESS_REPEATED, NODE: RETRY, NETWORK: RETRY,
          PREEMPTION: PREEMPTED, TIME_LIMIT: RETRY, DATA: UNLESS_REPEATED, STOKER: NEVER, CANCELLED: NEVER,
          HANG: RETRY}
INFRASTRUCTURE = (NODE, NETWORK)  # a host blamed for these twice is excluded where the engine can choose hosts

NEVER_STARTS = "the engine can never start it"  # the scheduler's stop reason for a request the engine refuses
STOKER_STOPS = ("another task failed", "the run was interrupted")  # stoker stopped it because of something else
# an exception that says nothing of its own: the log's tail is read for what happened
GENERIC_TYPES = {"", "TaskDied", "StokerError", "ExitCode", "ChildFailedError", "CalledProcessError", "TaskFailed",
                 "SystemExit"}
CONFIG_TYPES = {"ConfigError", "PreflightError", "GraphError", "ModuleNotFoundError", "ImportError"}
DATA_TYPES = {"DataError", "CheckpointError", "StoreError", "CorruptBlobError", "IsADirectoryError"}
OOM_TYPES = {"MemoryError", "OutOfMemoryError"}
NODE_TYPES = {"NodeLost"}  # the driver's record of a gang node whose heartbeats stopped (runtime/driver/lostnodes.py)
# what stoker raises on purpose about the step's own input: not stoker's own error even where no step frame shows
DELIBERATE = {"StokerError", "BackendError", "TrainingError", "TaskFailed", "Preempted", "StepTimeout", "TaskHang",
              "FailureHandledByCatch"}
WRAPPERS = {"ChildFailedError", "SignalException", "StokerError", "CalledProcessError", "TaskDied"}

class _lazy:  # noqa: N801 - used as re.compile is
    """A pattern compiled at its first use: these match only a failed attempt's text, and compiling them all was
    ~3 ms of every run's start."""

    __slots__ = ("_args", "_compiled")

    def __init__(self, *args: Any) -> None:
        self._args, self._compiled = args, None

    def __getattr__(self, name: str) -> Any:
        if self._compiled is None:
            self._compiled = re.compile(*self._args)
        return getattr(self._compiled, name)


_I = re.IGNORECASE
# (kind, pattern) in priority order: an OOM explains the collective timeouts of its peers, a dead device explains a
# failed collective
PATTERNS: list[tuple[str, Any]] = [
    (OOM, _lazy(r"CUDA out of memory|torch\.(?:cuda\.)?OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|"
                r"cudaErrorMemoryAllocation|NRT_RESOURCE|nrt_tensor_allocate[^\n]*fail|"
                r"Failed to allocate[^\n]*(?:device|HBM)|RESOURCE_EXHAUSTED|out of (?:device|HBM) memory|"
                r"\bMemoryError\b|std::bad_alloc|Cannot allocate memory|Out of memory: Killed process|"
                r"oom-kill|OOMKilled")),
    (NODE, _lazy(r"\bNRT\b[^\n]*(?:ERROR|[Ee]rror|[Ff]ail)|(?:ERROR|[Ee]rror|[Ff]ail)[^\n]*\b(?:NRT|nrt_\w+)\b|"
                 r"\bnrt_\w+[^\n]*(?:[Ff]ail|status=[1-9]|[Ee]rror)|NRT_(?:FAILURE|UNINITIALIZED|EXEC\w*|TIMEOUT|"
                 r"HW_ERROR)|NEURON_RT[^\n]*[Ee]rror|uncorrectable ECC|fallen off the bus|\bXid\b|"
                 r"cudaErrorECCUncorrectable|CUDA error: unknown error|\bNVRM\b|"
                 r"failed \(exitcode: -9\)|exitcode\s*:\s*-9\b|Signal 9 \(SIGKILL\)")),
    (NETWORK, _lazy(r"Watchdog caught collective operation timeout|ProcessGroupNCCL[^\n]*[Tt]imeout|"
                    r"NCCL (?:WARN|[Ee]rror)|nccl(?:System|Remote|Internal)Error|DistNetworkError|"
                    r"DistBackendError|Connection closed by peer|Connection reset by peer|"
                    r"Connection refused[^\n]*(?:rendezvous|[Ss]tore|gloo|nccl|c10d)|"
                    r"Rendezvous(?:Timeout|Connection|Closed)Error|gloo[^\n]*[Tt]imed out|"
                    r"[Tt]imed out[^\n]*(?:gloo|collective|rendezvous|barrier|allreduce|all_reduce|TCPStore)|"
                    r"Socket Timeout|NET/OFI|libfabric|\bfi_\w+ failed|\bEFA\b[^\n]*(?:[Ee]rror|[Ff]ail)")),
    (CONFIG, _lazy(r"ModuleNotFoundError|No module named|CUDA driver version is insufficient|"
                   r"Invalid feature specification|CannotPullContainerError|MISCONFIGURATION|"
                   r"command not found")),
    (DATA, _lazy(r"No space left on device|Input/output error|Stale file handle|Read-only file system|"
                 r"Disk quota exceeded|CorruptBlobError|CheckpointError")),
]
# the trainer's non-finite loss (stoker.train.trainer: "loss is nan at step 12 (lr ...)"), as the task's exception or
# its rank's line in the log ("[rank0] error: loss is nan at step 12 ..."): deterministic for the same data and seed
_NAN_LOSS = _lazy(r"\bloss is (nan|-?inf) at step (\d+)", _I)
_ENGINE_OOM = _lazy(r"out of memory|OutOfMemory|\boom\b|memory usage", _I)
_ENGINE_NODE = _lazy(r"node fail|failed to boot|\blost\b|Host EC2|instance[^;]*terminated|NODE_FAIL|"
                     r"not responding|unreachable|CannotStartContainer|DockerTimeout|Task failed to start|"
                     r"JobLaunchFailure|launch fail|ResourceInitializationError", _I)
_ENGINE_TIME = _lazy(r"time limit|timed out|deadline|duration exceeded", _I)
_ENGINE_CONFIG = _lazy(r"MISCONFIGURATION|CannotPullContainer|Invalid feature|CannotInspectContainer", _I)
_STOKER_FRAME = _lazy(r'[/\\]stoker[/\\](?:runtime|features|flow|store|backends|distributed|client|cards|cli|'
                      r'runner|_\w+|errors|exitstatus|redact)[/\\.]')
_LIB_FRAME = _lazy(r"[/\\]lib[/\\](?:python3?[\d.]*|pypy[\d.]*)[/\\]|^<frozen |^<string>")
_PREFIX = r"(?:\[[^\]\n]*\]:?\s*)?"  # a rank's prefix, e.g. "[rank1]: " or "[default0]:"
_FRAME = _lazy(rf'^{_PREFIX}\s*File "([^"]+)", line \d+', re.MULTILINE)
_EXC_LINE = _lazy(rf"^{_PREFIX}(?:[\w.]+\.)?(\w+(?:Error|Exception|Interrupt|Exit))\b:? ?(.*)$", re.MULTILINE)


@dataclass(frozen=True)
class Cause:
    """One failed attempt's cause: ``kind`` (a key of :data:`LABELS`), ``evidence`` (one line: what showed it),
    ``retry`` (a policy of :data:`POLICY`) and ``signature`` (what "the same failure again" compares)."""

    kind: str
    evidence: str
    retry: str
    signature: str = ""
    weak: bool = False  # guessed from how the process ended, not from a specific fact (a gang prefers another)

    @property
    def label(self) -> str:
        return LABELS.get(self.kind, self.kind)

    def line(self) -> str:
        return f"{self.label} ({self.evidence})" if self.evidence else self.label

    def as_record(self) -> dict[str, str]:
        """The keys the failed manifest's exception gets."""
        return {"cause": self.kind, "evidence": self.evidence}


def cause(kind: str, evidence: str, signature: str = "", weak: bool = False) -> Cause:
    return Cause(kind, _one_line(evidence), POLICY[kind], signature or f"{kind}: {normalize(evidence, kind)}", weak)


@dataclass
class _Facts:
    """What :func:`classify` looks at, read once."""

    etype: str
    message: str
    exc: dict[str, Any]
    code: int | None
    sig: int | None  # the signal that ended the process (a negative exit code, or 128+N)
    reason: str  # the engine's
    stop: str  # stoker's
    text: str  # the exception's type, message and last lines
    log: str  # the log's tail, when the exception is generic (else "")
    host_oom: bool
    died: bool  # the process wrote no manifest of its own (the scheduler wrote one)

    @property
    def signature(self) -> str:
        return f"{self.etype}: {self.message}"


def classify(manifest: dict | None, status: Any = None, log_tail: str = "", *, stop_reason: str | None = None,
             host_oom: bool = False) -> Cause:
    """The cause of a failed attempt. ``status``: its ``JobStatus`` (or anything with ``exit_code`` and ``reason``),
    ``log_tail``: the end of its stderr and stdout, ``stop_reason``: why stoker stopped it (None: it did not),
    ``host_oom``: the kernel's OOM killer ran while it did (stoker.runtime.driver.attribution reads /proc/vmstat)."""
    f = _facts(manifest, status, log_tail, stop_reason, host_oom)
    for rule in (_stopped, _preempted, _time_limit, _hang, _diverged, _configured, _engine, _typed, _patterns):
        found = rule(f)
        if found is not None:
            return found
    return _by_ending(f)


def _facts(manifest: dict | None, status: Any, log_tail: str, stop: str | None, host_oom: bool) -> _Facts:
    exc = (manifest or {}).get("exception") or {}
    etype, message = str(exc.get("type") or ""), str(exc.get("message") or "")
    code = getattr(status, "exit_code", None)
    reason = str(getattr(status, "reason", None) or "")
    text = f"{etype}: {message}\n{_exception_lines(str(exc.get('traceback') or ''))}"
    log = log_tail if etype in GENERIC_TYPES else ""
    return _Facts(etype, message, exc, code, signal_of(code), reason, stop or "", text, log, host_oom,
                  died=etype in ("TaskDied", ""))


def signal_of(code: int | None) -> int | None:
    """The signal of an exit code: -N (a process the caller waited for), 128+N (a shell's or a container's)."""
    if code is None or code == 0:
        return None
    if code < 0:
        return -code
    return code - 128 if 128 < code <= 128 + 64 else None


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _stopped(f: _Facts) -> Cause | None:
    if f.stop.startswith(STOKER_STOPS):
        return cause(CANCELLED, f"stoker stopped it: {f.stop}")
    if f.stop and not f.stop.startswith(("it exceeded", NEVER_STARTS)):  # stopped for another task's failure
        kind = NODE if re.search(r"\blost\b", f.stop) else CANCELLED  # e.g. "node 1 of its gang was lost"
        return cause(kind, f"stoker stopped it: {f.stop}", weak=True)
    if not f.stop and re.search(r"\bcancel", f.reason, _I):  # scancel, a Batch TerminateJob: a person's decision
        return cause(CANCELLED, f"the engine reports {f.reason}; stoker did not ask for it")
    return None


def _preempted(f: _Facts) -> Cause | None:
    if f.exc.get("preempted"):
        step = f.exc.get("resume_step")
        return cause(PREEMPTION, "stopped by SIGTERM after committing a checkpoint" +
                     (f" at step {step}" if step is not None else "") + f" (exit code {EXIT_PREEMPTED})")
    if f.code == EXIT_PREEMPTED:
        return cause(PREEMPTION, f"exit code {EXIT_PREEMPTED}")
    if re.search(r"preempt", f.reason, _I):
        return cause(PREEMPTION, f.reason)
    return None


def _time_limit(f: _Facts) -> Cause | None:
    if f.stop.startswith("it exceeded"):
        return cause(TIME_LIMIT, f"stoker stopped it: {f.stop}")
    if f.etype == "StepTimeout":
        return cause(TIME_LIMIT, f"{f.etype}: {f.message}")
    if _ENGINE_TIME.search(f.reason):
        return cause(TIME_LIMIT, f.reason)
    return None


def _hang(f: _Facts) -> Cause | None:
    if f.etype == "TaskHang":
        return cause(HANG, f"{f.etype}: {f.message}")
    if f.code == EXIT_HANG and f.died:  # the watchdog ended a step that did not unwind
        return cause(HANG, f"exit code {EXIT_HANG}: the task's watchdog ended it (no progress for its hang timeout; "
                           f"its stacks are in its log)")
    return None


def _diverged(f: _Facts) -> Cause | None:
    """A NaN (or infinite) loss: the step's own error, its evidence the loss's value and step; never retried as is
    (the same data, seed and settings give the same NaN: lower the learning rate, or resume from a checkpoint)."""
    for where, text in (("exception", f.text), ("log", f.log)):
        m = _NAN_LOSS.search(text)
        if m is not None:
            line = _matching_line(_NAN_LOSS, text) or m.group(0)
            evidence = f"the loss was {m.group(1).lower()} at step {m.group(2)} ({where}: {line})"
            return Cause(USER, _one_line(evidence), NEVER, f"{USER}: loss is {m.group(1).lower()} at step {m.group(2)}")
    return None


def _configured(f: _Facts) -> Cause | None:
    if f.stop.startswith(NEVER_STARTS):
        return cause(CONFIG, f.stop)
    if f.exc.get("permanent") or f.etype in CONFIG_TYPES:
        return cause(CONFIG, f"{f.etype}: {f.message}", f"{CONFIG}: {f.signature}")
    if f.code == EXIT_PERMANENT:
        return cause(CONFIG, f"exit code {EXIT_PERMANENT} (a deterministic error)")
    if f.code in (126, 127):
        return cause(CONFIG, f"exit code {f.code}: " + ("a command was not found" if f.code == 127 else
                                                         "a command could not be executed"))
    if _ENGINE_CONFIG.search(f.reason):
        return cause(CONFIG, f.reason)
    return None


def _engine(f: _Facts) -> Cause | None:
    if _ENGINE_OOM.search(f.reason):
        return cause(OOM, f.reason, f"{OOM}: {normalize(f.reason, OOM)}")
    if f.host_oom and f.sig == signal.SIGKILL:
        return cause(OOM, "killed by SIGKILL while the kernel's OOM killer ran (oom_kill in /proc/vmstat grew): "
                          "host memory")
    if _ENGINE_NODE.search(f.reason):
        return cause(NODE, f.reason)
    return None


def _typed(f: _Facts) -> Cause | None:
    if f.etype in DATA_TYPES or (f.message.startswith("saving artifacts failed") and _is_io(f.etype)):
        return cause(DATA, f"{f.etype}: {f.message}", f"{DATA}: {f.signature}")
    if f.etype in OOM_TYPES:
        return cause(OOM, f"{f.etype}: {f.message}", f"{OOM}: {normalize(f.signature, OOM)}")
    if f.etype in NODE_TYPES:
        return cause(NODE, f"{f.etype}: {f.message}", f"{NODE}: {normalize(f.signature)}")
    if f.etype == "UntrustedManifest":
        return cause(STOKER, f.message)
    return None


def _is_io(etype: str) -> bool:
    return etype in ("OSError", "IOError", "PermissionError", "FileNotFoundError", "TimeoutError", "StoreError")


def _patterns(f: _Facts) -> Cause | None:
    for kind, pattern in PATTERNS:
        for where, text in (("exception", f.text), ("log", f.log)):
            line = _matching_line(pattern, text)
            if line is None:
                continue
            if kind == NODE and f.host_oom:  # a rank killed by SIGKILL while the OOM killer ran
                return cause(OOM, f"{where}: {line}; the kernel's OOM killer ran: host memory")
            return cause(kind, f"{where}: {line}", f"{kind}: {normalize(line, kind)}")
    return None


def _matching_line(pattern: re.Pattern[str], text: str) -> str | None:
    m = pattern.search(text)
    if m is None:
        return None
    start = text.rfind("\n", 0, m.start()) + 1
    end = text.find("\n", m.end())
    return _one_line(text[start:end if end >= 0 else len(text)].strip(), 200)


def _by_ending(f: _Facts) -> Cause:
    sig = f.sig if f.died or f.code is not None and f.code < 0 else None
    if sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        why = f"; the engine says {f.reason}" if f.reason else "; the engine gives no reason"
        return cause(NODE, f"killed by {signal_name(sig)} from outside stoker{why}", weak=True)
    if f.died:
        how = f"killed by {signal_name(sig)}" if sig else f"exited with code {f.code}"
        line = _root_exception(f.log)
        if line and not _stoker_only(f.log):
            return cause(USER, f"its process {how} without a manifest; log: {line}", f"{USER}: {normalize(line)}")
        kind = STOKER if line else USER  # a bare exit: os._exit in the step, most often
        return cause(kind, f"its process {how} without writing its manifest" + (f"; log: {line}" if line else ""),
                     weak=True)
    trace = str(f.exc.get("traceback") or "")
    if trace and _stoker_only(trace) and f.etype not in DELIBERATE:
        return cause(STOKER, f"{f.etype}: {f.message} (raised in stoker, outside the step's code)",
                     f"{STOKER}: {f.signature}")
    weak = f.etype in GENERIC_TYPES
    line = _root_exception(f.log) if weak else None
    evidence = f"{f.etype}: {f.message}" + (f"; log: {line}" if line and line not in f.message else "")
    return cause(USER, evidence, f"{USER}: {normalize(line or f.signature)}", weak=weak and not line)


def _exception_lines(trace: str) -> str:
    """The last lines of a traceback: the exception and what it says."""
    return "\n".join(trace.strip().splitlines()[-3:])


def _root_exception(text: str) -> str | None:
    """The first exception line of the text that is not a launcher's wrapper (torchrun's ChildFailedError ...): in a
    log, the worker's own error comes before its launcher's report of it."""
    for etype, message in _EXC_LINE.findall(text):
        if etype not in WRAPPERS:
            return _one_line(f"{etype}: {message}".rstrip(": "), 200)
    return None


def _stoker_only(text: str) -> bool:
    """A traceback whose frames are all in stoker or in Python's library: the step's code never ran."""
    frames = _FRAME.findall(text)
    return bool(frames) and all(_STOKER_FRAME.search(p) or _LIB_FRAME.search(p) for p in frames)


def normalize(text: str, kind: str = "") -> str:
    """What "the same failure" compares: addresses, pids, ranks and node numbers (and for out of memory, every
    number: the free bytes differ each time) do not count."""
    text = re.sub(r"0x[0-9a-fA-F]+", "0x?", text)
    text = re.sub(r"\b(node|rank|pid|PID|local_rank|process)( ?[:=]? ?)\d+", r"\1\2?", text)
    if kind == OOM:
        text = re.sub(r"\d+(?:\.\d+)?", "?", text)
    return _one_line(text, 300)


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"
