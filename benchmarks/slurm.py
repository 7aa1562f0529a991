"""Slurm overhead: stoker's Slurm backend against the local backend and against submitit, in one run.

    python benchmarks/slurm.py                 # median of 3 runs of everything (~4 min on 2 cores)
    python benchmarks/slurm.py --quick         # 1 run each, no 20-x-submit row, allreduce gang probe only
    python benchmarks/slurm.py --repeat 5 --gang train

Needs the Slurm daemons (`apt-get install slurmctld slurmd slurm-client`; the localhost cluster of
tests/slurm_cluster.py runs them as root) and submitit (`pip install submitit`). With SLURM_CONF set it uses
that cluster (partition `debug`, or --partition); otherwise it starts a 3-node localhost cluster in a
temporary folder and stops it at the end. Every run uses a fresh folder under one temporary root, which is
declared shared (STOKER_SHARED_PATHS) and holds each run's STOKER_HOME: on a real cluster, put it on the
shared filesystem with --workdir.

1. Per-task overhead of a 20-way foreach (benchmarks/flows/foreach_flow.py: start -> 20 trivial
   tasks -> join -> end): `python flow.py run` on the local backend, with every step on Slurm
   (`--backend slurm`: start, one job array, join, end) and with only the foreach on Slurm
   (`--backend slurm=square`); against 20 trivial functions through submitit's `map_array` (one job
   array) and 20 `submit` calls. Per task = wall / 20 for all. Goal: stoker-slurm <= 1.5x submitit's array.
2. Time from launch to the first step of a 2-node gang (benchmarks/flows/slurm_gang_flow.py, one process
   per node): on the local backend, on Slurm (`--backend slurm=train`), and as a submitit 2-node job
   (`slurm_nodes=2, tasks_per_node=1`, rendezvous from submitit.helpers.TorchDistributedEnvironment,
   the same code run in-process). Two probes: `train`, a tiny `stoker.train` (model `tiny` with the
   Llama vocabulary, one step; dataset prepared once, before any timing), whose first step is the `time`
   of the first line rank 0 appends to metrics.jsonl; and `allreduce`, gloo init + one all_reduce
   (`stoker.train.collectives`), whose first step is when rank 0 writes its result file. Both markers
   are written by the job itself, so no log buffering or polling delay enters the figure (all processes
   share this host's clock). Goal: the stoker gang on Slurm starts in under 10 s on the idle cluster.

Launch times count from just before the `python ...` command starts (interpreter start and imports
included, for submitit too: its client runs as `python benchmarks/slurm.py _submitit ...`). Each gang
node runs with OMP_NUM_THREADS=1 under every launcher. The exit status is non-zero only when a run fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FLOWS = REPO / "benchmarks" / "flows"
SRC = REPO / "src"  # the stoker measured is this checkout's, whatever `pip install -e` points at
FOREACH_FLOW, GANG_FLOW = "foreach_flow.py", "slurm_gang_flow.py"  # the first is written for Metaflow
N_TASKS, GANG_NODES = 20, 2
RUN_TIMEOUT_S = 600
FOREACH_GOAL, GANG_GOAL_S = 1.5, 10.0
PROBES = ("train", "allreduce")


@dataclass
class Row:
    """One way of running one piece of work: its wall times (and first-step times for gangs) per run."""

    key: str
    title: str
    wall: list[float] = field(default_factory=list)
    first: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    skipped: str = ""

    def median(self, attr: str = "wall") -> float | None:
        """The median over the runs that succeeded (a failed run is reported beside it)."""
        values = getattr(self, attr)
        return statistics.median(values) if values else None


@dataclass
class Bench:
    """What every run needs: where runs go, the Slurm environment, the prepared dataset, the partition."""

    root: Path
    slurm_env: dict[str, str]
    partition: str
    data: Path | None = None
    verbose: bool = False
    timeout: float = RUN_TIMEOUT_S
    counter: int = 0

    def run_dir(self, key: str) -> Path:
        self.counter += 1
        d = self.root / f"{self.counter:03d}-{key}"
        d.mkdir(parents=True)
        return d


# -- processes ----------------------------------------------------------------------------------------
def run_cmd(cmd: list[str], cwd: Path, env: dict[str, str], bench: Bench) -> tuple[float, str | None]:
    """Run a command to completion in its own session; (wall seconds, error or None). On timeout it gets
    SIGINT first (stoker then cancels its Slurm jobs), SIGKILL 20 s later."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=bench.timeout)
    except subprocess.TimeoutExpired:
        out = _interrupt(proc) + f"\n(stopped after {bench.timeout:g} s)"
    seconds = time.perf_counter() - t0
    if bench.verbose:
        print(out)
    if proc.returncode == 0:
        return seconds, None
    tail = "\n".join(out.strip().splitlines()[-25:])
    return seconds, f"`{' '.join(cmd)}` in {cwd} exited {proc.returncode}:\n{tail}"


def _interrupt(proc: subprocess.Popen) -> str:
    for sig, wait in ((signal.SIGINT, 20), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            return proc.communicate(timeout=wait)[0]
        except subprocess.TimeoutExpired:
            continue
    return "(the command survived SIGKILL)"


def base_env(bench: Bench) -> dict[str, str]:
    """The environment of every run: this checkout's stoker first on the path (Slurm jobs inherit it)."""
    path = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, **bench.slurm_env, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # both tools may cache bytecode, as on a user's machine
    return env


def stoker_run(bench: Bench, key: str, flow: str, args: list[str], backend: str) -> tuple[float, Path, str | None]:
    """`python flow.py run ARGS --backend B` in a fresh folder with a fresh STOKER_HOME; (wall, folder, error)."""
    from orchestration import stoker_copy  # this folder is on sys.path when the script runs

    work = bench.run_dir(key)
    if "from metaflow import" in (FLOWS / flow).read_text():
        stoker_copy(FLOWS / flow, work / flow)  # the orchestration benchmark's flow, import line changed
    else:
        shutil.copy(FLOWS / flow, work / flow)
    env = base_env(bench) | {"STOKER_HOME": str(work / ".stoker"), "STOKER_SHARED_PATHS": str(bench.root)}
    cmd = [sys.executable, flow, "run", "--backend", backend, *args]
    seconds, err = run_cmd(cmd, work, env, bench)
    return seconds, work, err


def submitit_run(bench: Bench, key: str, mode: str, args: list[str]) -> tuple[float, Path, str | None]:
    """This script's `_submitit MODE FOLDER PARTITION [ARGS]` client in a fresh folder; (wall, folder, error)."""
    work = bench.run_dir(key)
    cmd = [sys.executable, str(Path(__file__).resolve()), "_submitit", mode, str(work), bench.partition, *args]
    seconds, err = run_cmd(cmd, work, base_env(bench), bench)
    return seconds, work, err


# -- the submitit side (runs in its own process: `python benchmarks/slurm.py _submitit ...`) ---------------
def _square(x: int) -> int:
    return x * x


def _node_addr(host: str) -> str:
    """The address of a Slurm node name (on the localhost test cluster, n1 is not in DNS: ask scontrol)."""
    with contextlib.suppress(OSError):
        return socket.gethostbyname(host)
    out = subprocess.run(["scontrol", "show", "node", host, "-o"], capture_output=True, text=True).stdout
    return next((w.split("=", 1)[1] for w in out.split() if w.startswith("NodeAddr=")), host)


def _gang_node(probe: str, argv: list[str]) -> int:
    """One task of the 2-node submitit job: rendezvous from the Slurm environment, then the probe in-process."""
    import submitit

    dist_env = submitit.helpers.TorchDistributedEnvironment()
    dist_env.master_addr = _node_addr(dist_env.master_addr)
    dist_env.export(set_cuda_visible_devices=False)
    if probe == "train":
        from stoker.train.__main__ import main
    else:
        from stoker.train.collectives import main
    rc = main(argv)
    if rc:
        raise RuntimeError(f"{probe} exited {rc} on rank {dist_env.rank}")
    return rc


def _watch(job_ids: list[str], folder: str) -> None:
    """Fail fast when the jobs end without results: without Slurm accounting (sacct) submitit waits forever.

    One `squeue` call every 2 s for all of them, in a thread; the client normally exits before it fires."""

    def watch() -> None:
        while True:
            time.sleep(2)
            q = subprocess.run(["squeue", "-h", "-j", ",".join(job_ids)], capture_output=True, text=True)
            if q.returncode == 0 and not q.stdout.strip():
                break
        time.sleep(10)  # the results are read by now unless the job failed
        logs = sorted(f for f in Path(folder).glob("*/*.err") if f.stat().st_size)
        tail = "\n".join(f"== {f}\n" + f.read_text(errors="replace")[-1500:] for f in logs[:2])
        print(f"submitit job(s) {','.join(job_ids)} ended without results:\n{tail}", file=sys.stderr, flush=True)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def submitit_client(mode: str, folder: str, partition: str, rest: list[str]) -> int:
    """map_array | submit | gang-train | gang-allreduce, waiting for every result as a user would."""
    import submitit

    ex = submitit.AutoExecutor(folder=os.path.join(folder, "%j"))
    ex.update_parameters(slurm_partition=partition, timeout_min=5, cpus_per_task=1)
    items = list(range(N_TASKS))
    if mode == "map_array":
        jobs = ex.map_array(_square, items)
        _watch([jobs[0].job_id.split("_")[0]], folder)
        results = [j.result() for j in jobs]
    elif mode == "submit":
        jobs = [ex.submit(_square, i) for i in items]
        _watch([j.job_id for j in jobs], folder)
        results = [j.result() for j in jobs]
    else:
        ex.update_parameters(slurm_nodes=GANG_NODES, tasks_per_node=1)
        job = ex.submit(_gang_node, mode.removeprefix("gang-"), rest)
        _watch([job.job_id], folder)
        results = job.results()
        return 0 if results == [0] * GANG_NODES else 1
    return 0 if results == [i * i for i in items] else 1


# -- the foreach ----------------------------------------------------------------------------------------
def foreach_rows(submit_each: bool, slurm_missing: str) -> list[Row]:
    rows = [Row("local", "stoker, local backend"),
            Row("slurm", "stoker, every step on Slurm (--backend slurm)"),
            Row("slurm-square", "stoker, only the foreach on Slurm (--backend slurm=square)"),
            Row("map_array", "submitit, map_array (one job array)"),
            Row("submit", f"submitit, {N_TASKS} x submit")]
    for r in rows:
        if r.key.startswith("slurm") and slurm_missing:
            r.skipped = slurm_missing
        if r.key == "submit" and not submit_each:
            r.skipped = "--quick"
    return rows


def run_foreach(bench: Bench, row: Row) -> tuple[float, float | None, str | None]:
    """(wall, None, error): the same shape as run_gang's."""
    args = ["--n", str(N_TASKS)]
    if row.key in ("map_array", "submit"):
        seconds, _, err = submitit_run(bench, f"foreach-{row.key}", row.key, [])
    else:
        backend = {"local": "local", "slurm": "slurm", "slurm-square": "slurm=square"}[row.key]
        seconds, _, err = stoker_run(bench, f"foreach-{row.key}", FOREACH_FLOW, args, backend)
    return seconds, None, err


# -- the gang ---------------------------------------------------------------------------------------------
def gang_rows(probe: str, slurm_missing: str) -> list[Row]:
    rows = [Row(f"{probe}:local", f"stoker, local backend [{probe}]"),
            Row(f"{probe}:slurm", f"stoker, gang on Slurm (--backend slurm=train) [{probe}]"),
            Row(f"{probe}:submitit", f"submitit, {GANG_NODES}-node job [{probe}]")]
    if slurm_missing:
        rows[1].skipped = slurm_missing
    return rows


def probe_args(bench: Bench, probe: str, out: Path) -> list[str]:
    """The probe's command-line arguments (the same for the stoker flow and the submitit job)."""
    if probe == "allreduce":
        return ["--sizes", "4K", "--iters", "1", "--warmup", "0", "--timeout", "120",
                "--out", str(out / "allreduce.json")]
    sets = ['model.name="tiny"', "model.vocab_size=32000", "model.max_seq_len=128", "train.steps=1",
            "train.micro_batch_size=2", f"train.global_batch_size={2 * GANG_NODES}", "train.log_every=1",
            "checkpoint.every=0", "checkpoint.save_final=false", "metrics.tensorboard=false",
            "metrics.progress=false"]
    return ["--data", str(bench.data), "--out-dir", str(out)] + [f"--set={s}" for s in sets]


def first_step_time(probe: str, out: Path) -> float | None:
    """Wall-clock time of the first step, from the marker the job wrote (see the module docstring)."""
    if probe == "allreduce":
        f = out / "allreduce.json"
        return f.stat().st_mtime if f.exists() else None
    f = out / "metrics.jsonl"
    if not f.exists() or not f.read_text().strip():
        return None
    return float(json.loads(f.read_text().splitlines()[0])["time"])


def run_gang(bench: Bench, row: Row) -> tuple[float, float | None, str | None]:
    """(wall, seconds from launch to the first step, error)."""
    probe, how = row.key.split(":")
    out = bench.root / f"gang-out-{bench.counter + 1:03d}-{how}"
    out.mkdir()
    args = probe_args(bench, probe, out)
    t0 = time.time()
    if how == "submitit":
        seconds, _, err = submitit_run(bench, f"gang-{probe}-submitit", f"gang-{probe}", args)
    else:
        entry = "stoker.train" if probe == "train" else "stoker.train.collectives"
        flow_args = ["--entrypoint", entry, "--args", shlex.join(args)]
        backend = "local" if how == "local" else "slurm=train"
        seconds, _, err = stoker_run(bench, f"gang-{probe}-{how}", GANG_FLOW, flow_args, backend)
    first = first_step_time(probe, out)
    if err is None and first is None:
        err = f"{row.title}: the run succeeded but left no first-step marker in {out}"
    return seconds, None if first is None else first - t0, err


# -- set-up ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def slurm_cluster(root: Path) -> Iterator[dict[str, str]]:
    """SLURM_CONF's cluster when set, else a fresh localhost cluster (tests/slurm_cluster.py) under root."""
    if os.environ.get("SLURM_CONF"):
        print(f"using the Slurm cluster of SLURM_CONF={os.environ['SLURM_CONF']}")
        yield {"SLURM_CONF": os.environ["SLURM_CONF"]}
        return
    sys.path.insert(0, str(REPO / "tests"))
    from slurm_cluster import SlurmCluster, available

    if reason := available():
        sys.exit(f"error: cannot start a Slurm cluster here: {reason}")
    t0 = time.perf_counter()
    with SlurmCluster(root / "cluster", nodes=3) as cluster:
        print(f"started a localhost Slurm cluster ({', '.join(cluster.nodes)}, {cluster.cpus_per_node} CPUs each) "
              f"in {time.perf_counter() - t0:.1f} s")
        yield dict(cluster.env)
    print("stopped the Slurm cluster")


def slurm_backend_missing() -> str:
    """Why the stoker Slurm rows cannot run ("" when they can)."""
    if not (SRC / "stoker" / "backends" / "slurm").is_dir():
        return f"no Slurm backend in {SRC / 'stoker' / 'backends'}"
    return ""


def prepare_data(bench: Bench) -> None:
    """The training probe's dataset, prepared once, before any timing (Llama tokenizer, 128 + 1 positions)."""
    sys.path.insert(0, str(SRC))
    from stoker.data import prepare

    t0 = time.perf_counter()
    ref = prepare("shakespeare", tokenizer="llama", block_size=129, val_fraction=0.0,
                  output=str(bench.root / "data"))
    bench.data = Path(ref.url)
    print(f"prepared the dataset in {time.perf_counter() - t0:.1f} s: {bench.data}")


def warm_up(bench: Bench) -> None:
    """Untimed: bytecode and page cache for stoker/torch/submitit, and a first job on every Slurm node."""
    env = base_env(bench)
    subprocess.run([sys.executable, "-c", "import torch, submitit, stoker.train.trainer"], env=env, check=True)
    subprocess.run(["srun", "-p", bench.partition, "-N", str(GANG_NODES), "true"], env=env, check=False,
                   timeout=60)
    _, _, err = stoker_run(bench, "warmup", FOREACH_FLOW, ["--n", "2"], "local")
    if err:
        sys.exit(f"error: the warm-up run failed\n{err}")


# -- the report -----------------------------------------------------------------------------------------
def _fmt(v: float | None, width: int = 9) -> str:
    return f"{v:>{width}.2f}" if v is not None else f"{'-':>{width}}"


def _x(ratio: float | None) -> str:
    return f"{ratio:.2f}x" if ratio is not None else "n/a"


def _s(seconds: float | None) -> str:
    return f"{seconds:.2f} s" if seconds is not None else "n/a"


def _cell(row: Row) -> str:
    if row.skipped:
        return f"skipped ({row.skipped})"
    n = len(row.failures)
    return f"{n} of {n + len(row.wall)} runs FAILED" if n else ""


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else "PASS" if ok else "MISS"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def print_foreach(rows: list[Row]) -> None:
    by = {r.key: r for r in rows}
    print(f"\nforeach of {N_TASKS} trivial tasks (start -> foreach -> join -> end for stoker), median wall")
    print(f"  {'':<62} {'wall s':>9} {'per task s':>11}")
    for r in rows:
        w = r.median()
        print(f"  {r.title:<62} {_fmt(w)} {_fmt(w / N_TASKS if w else None, 11)}  {_cell(r)}")
    sub = by["map_array"].median()
    for key in ("slurm", "slurm-square"):
        ratio = _ratio(by[key].median(), sub)
        ok = None if ratio is None else ratio <= FOREACH_GOAL
        print(f"  {by[key].title.split('(')[0].strip()} / submitit map_array: {_x(ratio)} "
              f"(goal <= {FOREACH_GOAL}x) {verdict(ok)}")
    slurm, local = by["slurm"].median(), by["local"].median()
    extra = (slurm - local) / N_TASKS if slurm is not None and local is not None else None
    print(f"  stoker Slurm / stoker local: {_x(_ratio(slurm, local))}; Slurm's extra per task: {_s(extra)}")


def print_gang(rows: list[Row]) -> None:
    print(f"\n{GANG_NODES}-node gang, 1 process per node: seconds from launch to the first step (median)")
    print(f"  {'':<62} {'1st step':>9} {'wall s':>9}")
    for r in rows:
        print(f"  {r.title:<62} {_fmt(r.median('first'))} {_fmt(r.median())}  {_cell(r)}")
    by = {r.key: r for r in rows}
    for probe in PROBES:
        if f"{probe}:slurm" not in by:
            continue
        s, loc, sub = (by[f"{probe}:{h}"].median("first") for h in ("slurm", "local", "submitit"))
        ok = None if s is None else s < GANG_GOAL_S
        print(f"  [{probe}] stoker on Slurm: {_s(s)} (goal < {GANG_GOAL_S:g} s) {verdict(ok)}; "
              f"/ submitit {_x(_ratio(s, sub))}; / local {_x(_ratio(s, loc))}")


# -- main -------------------------------------------------------------------------------------------------
def measure(bench: Bench, rows: list[Row], repeat: int, fn) -> None:
    """Every row once per round (interleaved, so drift hits all alike), `repeat` rounds."""
    for i in range(repeat):
        for r in rows:
            if r.skipped:
                continue
            seconds, first, err = fn(bench, r)
            extra = f" first step {first:6.2f}s" if first is not None else ""
            print(f"  {r.title:<62} run {i + 1}: {seconds:7.2f}s wall{extra}" + ("  FAILED" if err else ""),
                  flush=True)
            if err:
                r.failures.append(err)
            else:
                r.wall.append(seconds)
                if first is not None:
                    r.first.append(first)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 run each, no 20-x-submit row, allreduce probe only")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each row; the median is reported (default 3)")
    ap.add_argument("--gang", default=",".join(PROBES), help="gang probes: train, allreduce (default both)")
    ap.add_argument("--only", default="foreach,gang", help="foreach, gang or both (default)")
    ap.add_argument("--partition", default="debug", help="Slurm partition (default debug)")
    ap.add_argument("--workdir", type=Path, help="where the run folders go (a shared filesystem on a real cluster)")
    ap.add_argument("--timeout", type=float, default=RUN_TIMEOUT_S, help="seconds before a run is stopped")
    ap.add_argument("--keep", action="store_true", help="keep the run folders (their path is printed)")
    ap.add_argument("--verbose", action="store_true", help="print each run's output")
    args = ap.parse_args(argv)
    if args.quick:
        args.repeat, args.gang = 1, "allreduce"
    args.probes = [p.strip() for p in args.gang.split(",") if p.strip()]
    args.parts = {p.strip() for p in args.only.split(",") if p.strip()}
    if unknown := args.parts - {"foreach", "gang"}:
        ap.error(f"--only: unknown part(s) {', '.join(sorted(unknown))}; choose from foreach, gang")
    if unknown := set(args.probes) - set(PROBES):
        ap.error(f"--gang: unknown probe(s) {', '.join(sorted(unknown))}; choose from {', '.join(PROBES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="stoker-slurm-bench-", dir=args.workdir)).resolve()
    missing = slurm_backend_missing()
    foreach, gang = [], []
    try:
        with slurm_cluster(root) as slurm_env:
            bench = Bench(root, slurm_env, args.partition, verbose=args.verbose, timeout=args.timeout)
            warm_up(bench)
            if "foreach" in args.parts:
                foreach = foreach_rows(submit_each=not args.quick, slurm_missing=missing)
                measure(bench, foreach, args.repeat, run_foreach)
            if "gang" in args.parts:
                if "train" in args.probes:
                    prepare_data(bench)
                gang = [r for p in args.probes for r in gang_rows(p, missing)]
                measure(bench, gang, args.repeat, run_gang)
    finally:
        if args.keep:
            print(f"run folders kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    if foreach:
        print_foreach(foreach)
    if gang:
        print_gang(gang)
    failures = [f for r in foreach + gang for f in r.failures]
    for f in failures:
        print("\n" + f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["_submitit"]:
        sys.exit(submitit_client(*sys.argv[2:5], sys.argv[5:]))  # MODE FOLDER PARTITION [ARGS]
    sys.exit(main())
