"""Orchestration overhead: the same flows under stoker and under Metaflow, timed in one run.

Each flow in benchmarks/flows/ is written once for Metaflow (`from metaflow import ...`); the stoker copy is
the same file with only that import line changed to `from stoker import ...` — which is the compatibility
claim. Both run as `python flow.py run` in fresh temporary folders: Metaflow with its local datastore and
local metadata (in its own virtualenv, created once and cached), stoker with a fresh $STOKER_HOME.

    python benchmarks/orchestration.py            # 6-step linear, foreach over 100, 512 MB array
    python benchmarks/orchestration.py --quick    # smoke run: foreach over 10, 32 MB array
    python benchmarks/orchestration.py --only linear,foreach --repeat 3
    python benchmarks/orchestration.py --only foreach10k  # 10,000-way foreach (not in the default set)

Targets (wall time, Metaflow / stoker): >= 10x on linear and foreach, >= 5x on the array hand-off, >= 20x on
the 10,000-way foreach, where Metaflow runs a 200-way foreach and its time is scaled by 50 (linear
extrapolation, printed) and the scheduler's own CPU time (user + sys of the `run` process, not of its tasks)
is reported as a share of the wall time (goal < 10%).
A missed target prints MISS; the exit status is non-zero only when a flow fails under either tool.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

FLOWS_DIR = Path(__file__).resolve().parent / "flows"
DEFAULT_VENV = Path.home() / ".cache" / "stoker-bench" / "metaflow-venv"
METAFLOW_IMPORT = "from metaflow import "
STOKER_IMPORT = "from stoker import "


@dataclass
class Case:
    """One benchmark flow: its file, its `run` arguments and the speed-up target."""

    key: str
    title: str
    file: str
    args: list[str]
    target: float
    metaflow_args: list[str] | None = None  # Metaflow runs a smaller version ...
    scale: float = 1.0  # ... and its times are multiplied by this (linear extrapolation)
    sched_cpu: bool = False  # report the stoker scheduler process's own CPU time


@dataclass
class Result:
    """Wall and CPU seconds (user + sys of the whole process tree) of each run, per tool."""

    case: Case
    wall: dict[str, list[float]] = field(default_factory=lambda: {"metaflow": [], "stoker": []})
    cpu: dict[str, list[float]] = field(default_factory=lambda: {"metaflow": [], "stoker": []})
    sched_cpu: list[tuple[float, float]] = field(default_factory=list)  # (scheduler, fork server) user + sys
    failures: list[str] = field(default_factory=list)


def cases(quick: bool) -> list[Case]:
    n, mb = (10, 32) if quick else (100, 512)
    return [
        Case("linear", "linear, 6 steps", "linear_flow.py", [], 10.0),
        Case("foreach", f"foreach over {n} + join", "foreach_flow.py", ["--n", str(n)], 10.0),
        Case("array", f"{mb} MB numpy array hand-off", "bigarray_flow.py", ["--mb", str(mb)], 5.0),
    ]


def big_cases(quick: bool) -> list[Case]:
    """Run only when named with --only: minutes each. (Metaflow refuses a foreach over more than 100 items
    unless `run --max-num-splits` allows it.)"""
    n, mf_n = (1000, 20) if quick else (10_000, 200)
    return [Case("foreach10k", f"foreach over {n:,} + join", "foreach_flow.py", ["--n", str(n)], 20.0,
                 metaflow_args=["--n", str(mf_n), "--max-num-splits", str(mf_n)], scale=n / mf_n, sched_cpu=True)]


# The stoker run of a sched_cpu case: the flow file runs as __main__ in this wrapper, which writes the process's
# own CPU time (RUSAGE_SELF: the scheduler; its tasks are forked children and end in os._exit, never here) plus,
# with STOKER_TASK_LAUNCH=forkserver, the fork server's own (it reports its RUSAGE_SELF when the run closes it).
RUSAGE_WRAPPER = """import os, resource, runpy, sys
pid, out = os.getpid(), os.environ.pop("STOKER_BENCH_RUSAGE")
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    if os.getpid() == pid:
        r = resource.getrusage(resource.RUSAGE_SELF)
        fs = sys.modules.get("stoker.backends.local.forkserver")
        server = fs.SERVER_CPU[0] if fs else 0.0
        open(out, "w").write(f"{r.ru_utime + r.ru_stime + server} {server}")
"""


# -- the Metaflow virtualenv ------------------------------------------------------------------------
def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _venv_ok(venv: Path) -> str | None:
    """Metaflow's version when the venv has metaflow and numpy importable, else None."""
    py = venv_python(venv)
    if not py.exists():
        return None
    r = subprocess.run([str(py), "-c", "import metaflow, numpy; print(metaflow.__version__)"],
                       capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def ensure_metaflow_venv(venv: Path, metaflow_spec: str) -> str:
    """Create (or reuse) a virtualenv with Metaflow and numpy from PyPI; returns Metaflow's version."""
    version = _venv_ok(venv)
    if version:
        print(f"metaflow {version}: reusing {venv}")
        return version
    print(f"creating {venv} with {metaflow_spec} (once; cached) ...", flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv_python(venv)), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    metaflow_spec, "numpy"], check=True)
    version = _venv_ok(venv)
    if not version:
        sys.exit(f"error: {venv} was created but `import metaflow, numpy` fails in it; delete the folder and "
                 f"run again (or pass --venv PATH)")
    return version


# -- running one flow -------------------------------------------------------------------------------
def stoker_copy(src: Path, dst: Path) -> None:
    """The stoker flow file: the Metaflow file with its `from metaflow import` line(s) changed, nothing else."""
    lines = src.read_text().splitlines(keepends=True)
    changed = [STOKER_IMPORT + ln[len(METAFLOW_IMPORT):] if ln.startswith(METAFLOW_IMPORT) else ln
               for ln in lines]
    if changed == lines:
        raise SystemExit(f"error: {src} has no line starting with {METAFLOW_IMPORT!r}")
    dst.write_text("".join(changed))


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_tool(tool: str, case: Case, python: str, workroot: Path,
             verbose: bool) -> tuple[float, float, str | None, tuple[float, float] | None]:
    """Run `python flow.py run ARGS` for one tool in a fresh folder; (wall s, CPU s, error or None, scheduler
    CPU s or None).

    CPU time counts the whole process tree (both tools wait for their task processes)."""
    work = Path(tempfile.mkdtemp(prefix=f"{tool}-{case.key}-", dir=workroot))
    flow = work / case.file
    env = dict(os.environ)
    # As on a user's machine, both tools may cache compiled bytecode (some sandboxes turn this off).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if tool == "stoker":
        stoker_copy(FLOWS_DIR / case.file, flow)
        env["STOKER_HOME"] = str(work / ".stoker")
        cmd = [python, flow.name, "run", *case.args]
        if case.sched_cpu:
            env["STOKER_BENCH_RUSAGE"] = str(work / "rusage.txt")
            cmd = [python, "-c", RUSAGE_WRAPPER, flow.name, "run", *case.args]
    else:
        shutil.copy(FLOWS_DIR / case.file, flow)
        env.update(METAFLOW_HOME=str(work / "mfhome"), USERNAME="bench", METAFLOW_USER="bench",
                   METAFLOW_DEFAULT_DATASTORE="local", METAFLOW_DEFAULT_METADATA="local",
                   METAFLOW_DATASTORE_SYSROOT_LOCAL=str(work))
        cmd = [python, flow.name, "--no-pylint", "run",
               *(case.args if case.metaflow_args is None else case.metaflow_args)]
    cpu0, t0 = _children_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    seconds, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    if verbose:
        print(proc.stdout + proc.stderr)
    err = None
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
        err = f"{tool} {case.file} exited {proc.returncode}:\n{tail}"
    rusage = work / "rusage.txt"
    sched = None
    if rusage.exists():  # (the scheduler process alone, its fork server)
        both, server = map(float, rusage.read_text().split()[:2])
        sched = (both - server, server)
    shutil.rmtree(work, ignore_errors=True)  # the array case leaves ~1 GB per run behind otherwise
    return seconds, cpu, err, sched


def warm_up(pythons: dict[str, str], workroot: Path) -> None:
    """One untimed run of the linear flow per tool: neither pays for compiling .pyc files or a cold disk cache."""
    linear = cases(quick=True)[0]
    for tool, py in pythons.items():
        _, _, err, _ = run_tool(tool, linear, py, workroot, verbose=False)
        if err:
            sys.exit(f"error: the warm-up run failed\n{err}")


# -- report -----------------------------------------------------------------------------------------
def print_table(results: list[Result], mf_version: str) -> None:
    import stoker

    head = (f"{'flow':<28} {'Metaflow ' + mf_version:>17} {'stoker ' + stoker.__version__:>13} {'ratio':>7} "
            f"{'target':>6}  {'verdict':<7} | {'CPU: Metaflow':>13} {'stoker':>8} {'ratio':>7}")
    print("\n" + head)
    print("-" * len(head))
    for r in results:
        if r.failures:
            print(f"{r.case.title:<28} {'FAILED':>17}")
            continue
        mf, st = statistics.median(r.wall["metaflow"]), statistics.median(r.wall["stoker"])
        cmf, cst = statistics.median(r.cpu["metaflow"]), statistics.median(r.cpu["stoker"])
        if r.case.scale != 1.0:
            print(f"{r.case.title}: Metaflow ran {' '.join(r.case.metaflow_args or [])} in {mf:.2f}s wall, "
                  f"{cmf:.2f}s CPU; scaled linearly by {r.case.scale:g} to {mf * r.case.scale:.1f}s and "
                  f"{cmf * r.case.scale:.1f}s (the per-task cost times the number of tasks)")
            mf, cmf = mf * r.case.scale, cmf * r.case.scale
        ratio = mf / st
        verdict = "ok" if ratio >= r.case.target else "MISS"
        print(f"{r.case.title:<28} {mf:>16.2f}s {st:>12.2f}s {ratio:>6.1f}x {r.case.target:>5.0f}x  {verdict:<7} | "
              f"{cmf:>12.2f}s {cst:>7.2f}s {cmf / max(cst, 1e-9):>6.1f}x")
    print("wall time of `python flow.py run`, median over repeats; ratio = Metaflow / stoker; the target applies to "
          "wall time.\nCPU = user + sys seconds of the whole process tree (less sensitive to other load).")
    for r in results:
        if r.sched_cpu and not r.failures:
            wall = statistics.median(r.wall["stoker"])
            sched = statistics.median(c[0] for c in r.sched_cpu)
            server = statistics.median(c[1] for c in r.sched_cpu)
            print(f"{r.case.title}: stoker's scheduler process used {sched:.2f}s CPU (user + sys, its tasks excluded) "
                  f"= {100 * sched / wall:.1f}% of the wall time "
                  f"(goal < 10%: {'ok' if sched < 0.1 * wall else 'MISS'}); "
                  f"its fork server, which forks every task, {server:.2f}s = {100 * server / wall:.1f}%")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: foreach over 10 items, 32 MB array")
    ap.add_argument("--only", default="", help="comma-separated subset of: linear, foreach, array, foreach10k "
                    "(only when named)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per tool and flow; the median is reported")
    ap.add_argument("--venv", type=Path, default=DEFAULT_VENV, help=f"Metaflow's virtualenv (default {DEFAULT_VENV})")
    ap.add_argument("--metaflow", default="metaflow", help="pip requirement for Metaflow, e.g. metaflow==2.19.39")
    ap.add_argument("--workdir", type=Path, default=None, help="where the temporary run folders go")
    ap.add_argument("--verbose", action="store_true", help="print each run's output")
    args = ap.parse_args(argv)

    selected = cases(args.quick)
    if args.only:
        keys = {k.strip() for k in args.only.split(",") if k.strip()}
        everything = selected + big_cases(args.quick)
        unknown = keys - {c.key for c in everything}
        if unknown:
            ap.error(f"--only: unknown flow(s) {', '.join(sorted(unknown))}; choose from "
                     f"{', '.join(c.key for c in everything)}")
        selected = [c for c in everything if c.key in keys]

    mf_version = ensure_metaflow_venv(args.venv, args.metaflow)
    pythons = {"metaflow": str(venv_python(args.venv)), "stoker": sys.executable}
    workroot = Path(tempfile.mkdtemp(prefix="stoker-bench-", dir=args.workdir))
    results = []
    try:
        warm_up(pythons, workroot)
        for case in selected:
            res = Result(case)
            for i in range(args.repeat):
                for tool in ("metaflow", "stoker"):
                    seconds, cpu, err, sched = run_tool(tool, case, pythons[tool], workroot, args.verbose)
                    print(f"  {case.title:<28} {tool:<9} run {i + 1}: {seconds:7.2f}s wall {cpu:7.2f}s CPU"
                          + (f" ({sched[0]:.2f}s in the scheduler, {sched[1]:.2f}s in its fork server)"
                             if sched is not None else "")
                          + ("  FAILED" if err else ""), flush=True)
                    if sched is not None and not err:
                        res.sched_cpu.append(sched)
                    if err:
                        res.failures.append(err)
                    else:
                        res.wall[tool].append(seconds)
                        res.cpu[tool].append(cpu)
            results.append(res)
    finally:
        shutil.rmtree(workroot, ignore_errors=True)
    print_table(results, mf_version)
    failures = [f for r in results for f in r.failures]
    for f in failures:
        print("\n" + f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
