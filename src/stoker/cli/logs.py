"""`stoker logs FLOW/RUN/STEP[/TASK]`: every task's log of a step (every node of a gang), each line prefixed
with its task (and node, and attempt with --all-attempts)."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from typing import Any

from stoker.cli.argtypes import non_negative_int
from stoker.errors import ConfigError


def add_parser(sub: Any) -> None:
    """Register `python flow.py logs RUN/STEP[/TASK]` with Metaflow's options (both streams by default)."""
    p = sub.add_parser("logs", help="print the stdout and stderr of RUN/STEP[/TASK]")
    p.add_argument("pathspec", help="RUN/STEP or RUN/STEP/TASK")
    for name in ("stdout", "stderr"):
        p.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, default=False, help=f"show {name} only")
    p.add_argument("--both", action=argparse.BooleanOptionalAction, default=True, help="show stdout and stderr")
    p.add_argument("--timestamps", action=argparse.BooleanOptionalAction, default=False,
                   help="prefix each line with its attempt's start time (stoker does not stamp lines)")
    p.add_argument("--attempt", type=non_negative_int, default=None, help="this attempt instead of the latest")
    p.set_defaults(quiet=False)  # `python flow.py --quiet logs ...` sets it


def client_command(flow: str, args: argparse.Namespace) -> int:
    """Dispatch the flow CLI's `logs`, `dump` and `tag` commands for ``flow``."""
    quiet = bool(getattr(args, "quiet", False))
    if args.command == "dump":
        from stoker.cli.dump import dump

        return dump(flow, args.input_path, private=args.private, max_value_size=args.max_value_size,
                    include=args.include, file=args.file, quiet=quiet)
    if args.command == "tag":
        from stoker.cli.tag import tag_command

        return tag_command(flow, args, quiet)
    streams = [s for s in ("stdout", "stderr") if getattr(args, s)] or \
        (["stdout", "stderr"] if args.both else [])
    return show_logs(flow, args.pathspec, streams, timestamps=args.timestamps, attempt=args.attempt, quiet=quiet)


def show_logs(flow: str, input_path: str, streams: list[str], *, timestamps: bool = False,
              attempt: int | None = None, quiet: bool = False) -> int:
    """Metaflow's `logs`: for each task of RUN/STEP (or the one task), a header on stderr, then each stream's
    name (on stderr) and its lines (on stdout)."""
    from stoker.client import Run, Task

    parts = input_path.strip("/").split("/")
    if parts and parts[0] == flow and len(parts) > 2:
        parts = parts[1:]
    if len(parts) not in (2, 3) or not all(parts):
        raise ConfigError(f"logs {input_path}: input_path should either be run_id/step_name or "
                          "run_id/step_name/task_id")
    if len(parts) == 3:
        tasks = [Task(f"{flow}/{'/'.join(parts)}", attempt=attempt)]
    else:
        tasks = [t if attempt is None else Task(t.pathspec, attempt=attempt)
                 for t in Run(f"{flow}/{parts[0]}")[parts[1]]]
    if not tasks:
        raise ConfigError(f"No Tasks found at {input_path} -- either none exist or none have started yet")
    for t in tasks:
        if not quiet:
            print(f"Dumping logs of run_id={t.run_id} step={t.step_name} task_id={t.id}", file=sys.stderr)
        for stream in streams:
            if not quiet:
                print(stream, file=sys.stderr)
            sys.stderr.flush()
            for when, line in t.loglines(stream):
                stamp = ""
                if timestamps and when is not None:
                    local = when.replace(tzinfo=timezone.utc).astimezone().replace(tzinfo=None)
                    stamp = datetime.strftime(local, "%Y-%m-%d %H:%M:%S.%f")[:-3] + " "
                sys.stdout.write(f"{stamp}{line}\n")
            sys.stdout.flush()
    return 0


def print_logs(pathspec: str, stderr: bool = False, attempt: int | None = None, all_attempts: bool = False) -> int:
    from stoker.client import Run, Task

    parts = pathspec.strip("/").split("/")
    if len(parts) < 3:
        raise ConfigError(f"logs {pathspec}: give FLOW/RUN/STEP or FLOW/RUN/STEP/TASK")
    if len(parts) == 3:
        step = Run("/".join(parts[:2]))[parts[2]]
        tasks = sorted(step, key=lambda t: int(t.id) if t.id.isdigit() else t.id)
    else:
        tasks = [Task("/".join(parts[:4]), attempt=attempt)]
    stream = "stderr" if stderr else "stdout"
    shown = [a for t in tasks for a in (t.attempts if all_attempts else [t])]
    many = len(shown) > 1
    for t in shown:
        label = t.id
        node = (t.parallel or {}).get("node_index")
        if node is not None:
            label += f" node {node}"
        if all_attempts:
            label += f" attempt {t.retry_count}"
        for line in getattr(t, stream).splitlines():
            sys.stdout.write(f"[{label}] {line}\n" if many else f"{line}\n")
    return 0


def print_engine_logs(pathspec: str, follow: bool = False, out=None) -> int:
    """`stoker logs FLOW/RUN[/STEP[/TASK]] --engine [--follow]`: what the engine itself recorded for each node
    of each job of the run (CloudWatch Logs on AWS Batch, the per-node files on Slurm), every attempt, each line
    prefixed with its step, task, node and attempt. With --follow, new lines as they come until every job ends."""
    from stoker.backends import make_backend
    from stoker.cli.guardian import job_refs
    from stoker.runtime.contract import EXITED
    from stoker.store.blobs import open_store

    out = out or sys.stdout
    parts = pathspec.strip("/").split("/")
    if len(parts) < 2:
        raise ConfigError(f"logs {pathspec} --engine: give FLOW/RUN, FLOW/RUN/STEP or FLOW/RUN/STEP/TASK")
    refs = [r for r in job_refs(open_store(), parts[0], parts[1])
            if (len(parts) < 3 or r.step == parts[2]) and (len(parts) < 4 or parts[3] in r.task_ids)]
    if not refs:
        raise ConfigError(f"logs {pathspec} --engine: no cluster job of this run matches (local tasks have no "
                          f"engine log: use `stoker logs {pathspec}`)")
    refs.sort(key=lambda r: (r.submitted_at, r.step))
    backends = {name: make_backend(name) for name in {r.backend for r in refs}}

    def label(ref, member: int) -> str:
        task = ref.task_ids[member] if member < len(ref.task_ids) else "?"
        node = f" node {member}" if ref.kind == "gang" else ""
        return f"[{ref.step}/{task}{node} attempt {ref.attempt}]"

    def emit(ref, member: int, data: bytes) -> None:
        for line in data.decode(errors="replace").splitlines():
            out.write(f"{label(ref, member)} {line}\n")
        out.flush()

    if not follow:
        for r in refs:
            for member in range(r.members):
                emit(r, member, backends[r.backend].logs(r, member, "stdout") + backends[r.backend].logs(r, member,
                                                                                                         "stderr"))
        return 0
    live = {(r.backend, r.job_id): r for r in refs}
    while live:
        for name, backend in backends.items():
            group = [r for (b, _), r in live.items() if b == name]
            if not group:
                continue
            statuses = backend.poll(group)
            backend.wait(backend.poll_interval, lambda ref, member, _stream, data: emit(ref, member, data))
            for r in group:
                st = statuses.get(r.job_id)
                if st is not None and st.state == EXITED:
                    backend.wait(0.0, lambda ref, member, _stream, data: emit(ref, member, data))
                    live.pop((name, r.job_id), None)
    return 0
