"""Nothing waits forever across a fork (issue 33; docs/fork-safety.md): every place stoker forks, with what once made
a forked child wait for threads that do not exist after fork() (Metaflow's 01-playlist: BLAKE3's pool, started by
the run's process hashing an IncludeFile).

Each case runs in a subprocess with a timeout of its own: a hang fails in seconds, with the output so far, instead of
at pytest's global timeout. One run of tests/flows/fork_safety_flow.py carries every size and artifact kind (module
fixture); the other cases run the same flow with fewer sizes where stoker forks in other places.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import FLOWS

SIZES = {"0B": 0, "1KB": 1 << 10, "300KB": 300 << 10, "8MB": 8 << 20, "64MB": 64 << 20}  # as fork_safety_flow.py
HANG_S = 90  # a case that takes longer hung: a run of the flow takes ~30 s on 2 idle cores


def bounded(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = HANG_S,
            expect: int | None = 0) -> str:
    """Run ``args`` (its own session) with a hard timeout; its stdout and stderr together. A run still going after
    ``timeout`` s is killed and the test fails with its output, as is one whose exit code is not ``expect``."""
    p = subprocess.Popen(args, cwd=cwd, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as e:
        os.killpg(p.pid, signal.SIGKILL)  # its members die with it (PR_SET_PDEATHSIG, the run's reaper)
        p.wait()
        pytest.fail(f"{' '.join(map(str, args[1:]))} hung: still running after {timeout} s\n"
                    f"{(e.output or b'').decode(errors='replace')[-6000:]}", pytrace=False)
    text = out.decode(errors="replace")
    if expect is not None and p.returncode != expect:
        pytest.fail(f"{' '.join(map(str, args[1:]))} exited {p.returncode}, not {expect}\n{text[-6000:]}",
                    pytrace=False)
    return text


def include_files(folder: Path, sizes: list[str]) -> None:
    """The IncludeFiles fork_safety_flow.py reads: inc_<size>.bin, as its make(size, size)."""
    folder.mkdir(parents=True, exist_ok=True)
    for s in sizes:
        (folder / f"inc_{s}.bin").write_bytes(np.random.default_rng(SIZES[s]).bytes(SIZES[s]))


def flow_env(home: Path, sizes: list[str], **extra: str) -> dict[str, str]:
    return {"STOKER_HOME": str(home), "FORK_FLOW_DIR": str(home.parent / "inc"), "FORK_FLOW_SIZES": ",".join(sizes),
            **extra}


def run_fork_flow(cwd: Path, sizes: list[str], *args: str, expect: int | None = 0, timeout: float = HANG_S,
                  **env: str) -> str:
    include_files(cwd / "inc", sizes)
    return bounded([sys.executable, str(FLOWS / "fork_safety_flow.py"), *(args or ("run",))], cwd,
                   flow_env(cwd / "home", sizes, **env), timeout=timeout, expect=expect)


def checked(out: str, *steps: str) -> None:
    for s in steps:
        assert f"fork_safety_flow: {s} checked" in out, f"step {s} did not check its artifacts\n{out[-4000:]}"


# -- the root, directly: a pool started before a fork --------------------------------------------------------------
FORK_AND_HASH = textwrap.dedent("""
    import os, sys, time
    {setup}
    {parent}
    pid = os.fork()
    if pid == 0:
        {child}
        os._exit(0)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            sys.exit(os.waitstatus_to_exitcode(status))
        time.sleep(0.05)
    os.kill(pid, 9)
    sys.exit("the forked child did not finish within 15 s: it waits for a pool its parent started")
""")


def fork_case(setup: str, parent: str, child: str) -> str:
    code = FORK_AND_HASH.format(setup=setup, parent=parent, child=child)
    return bounded([sys.executable, "-c", code], Path.cwd(), timeout=60)


def test_a_child_hashes_after_its_parent_hashed_a_large_buffer():
    """BLAKE3 through stoker._hashing in the parent, then in a forked child: fails (the child waits forever) if the
    hasher uses BLAKE3's AUTO thread pool again."""
    fork_case("from stoker._hashing import BLAKE3, content_key, file_key\ndata = os.urandom(64 << 20)",
              "content_key(data, BLAKE3)",
              "assert content_key(data, BLAKE3) == content_key(bytes(data), BLAKE3)")


@pytest.mark.torch
def test_a_child_runs_torch_after_its_parent_ran_its_thread_pool():
    """torch's intra-op (OpenMP) pool, started in the parent, is released before every fork of a process that
    imported stoker (stoker._process): without it the child's first parallel op waits forever."""
    pytest.importorskip("torch")
    fork_case("import torch, stoker._process\ntorch.set_num_threads(2)\na = torch.rand(800, 800)", "a @ a",
              "torch.set_num_threads(2); assert float((a @ a).sum()) > 0")


def test_unsafe_to_fork_names_what_a_child_would_not_survive():
    import threading

    from stoker._process import unsafe_to_fork

    stop = threading.Event()
    t = threading.Thread(target=stop.wait, name="a-pool-worker", daemon=True)
    t.start()
    try:
        why = unsafe_to_fork(max_threads=1)
        assert "threads" in why and "a-pool-worker" in why, why
    finally:
        stop.set()
        t.join()
    assert unsafe_to_fork(runtimes=("json",)) == "json imported"  # a device runtime: any module named in runtimes


# -- the local backend: the run's process, the fork server, a resumed run ----------------------------------------
@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    """One run of every size and kind that fails at `end` on purpose, then its resume (which clones the other steps
    and reads their artifacts again): (the run's output, the resume's output, STOKER_HOME)."""
    cwd = tmp_path_factory.mktemp("fork-matrix")
    sizes = list(SIZES)
    first = run_fork_flow(cwd, sizes, expect=None, FORK_FLOW_FAIL_END="1")
    assert "end fails on purpose" in first, first[-6000:]
    resumed = run_fork_flow(cwd, sizes, "resume")
    return first, resumed, cwd / "home"


@pytest.mark.slow
def test_every_size_made_in_the_driver_and_in_tasks_reaches_every_step(matrix, monkeypatch):
    first, _, home = matrix
    checked(first, "carded", "monitored", "join", "end")
    monkeypatch.setenv("STOKER_HOME", str(home))
    from stoker import Flow

    run = Flow("ForkSafetyFlow").latest_run  # the resumed one: its other steps cloned from the first
    start = run["start"].task
    assert len(start.data.inc_64MB) == 64 << 20 and start.data.bytes_64MB[:8] == np.random.default_rng(
        (64 << 20) + 1).bytes(8)
    assert run["carded"].task.successful and run["monitored"].task.successful
    shown = run.parameters["inc_64MB"]  # the run record shows a short repr: JSON of 64 MB took the driver minutes
    assert len(shown) < 200 and shown.endswith(f"({64 << 20} bytes)"), shown[:300]


@pytest.mark.slow
def test_a_resumed_run_reads_every_artifact_again(matrix):
    _, resumed, _ = matrix
    checked(resumed, "end")
    assert "fork_safety_flow: done in run" in resumed and "succeeded" in resumed, resumed[-4000:]


@pytest.mark.slow
def test_members_forked_by_the_run_process_itself(tmp_path):
    """STOKER_TASK_LAUNCH=fork: the run's process (which read and hashed the IncludeFiles) forks every task."""
    out = run_fork_flow(tmp_path, ["0B", "300KB", "8MB"], STOKER_TASK_LAUNCH="fork")
    checked(out, "carded", "monitored", "join", "end")


# -- elsewhere: S3, Slurm, warm ranks --------------------------------------------------------------------------------
@pytest.mark.aws
def test_a_forked_child_drops_its_parents_s3_connections(aws):
    """The run's S3 store, used before a fork, is used by the forked member and by the run at once: the child opens
    connections of its own (sharing the parent's would mix their replies) and gets its own transfer slots."""
    aws.client("s3").create_bucket(Bucket="fork-bucket")
    code = textwrap.dedent("""
        import os, sys
        from stoker.store.objects.s3 import S3Objects
        s = S3Objects("fork-bucket", "x")
        s.put_bytes("a", b"1" * 1000)
        assert s.get_bytes("a") == b"1" * 1000
        pool = s.client._endpoint.http_session._manager.pools
        assert len(pool) == 1, "the parent keeps a connection"
        slots = s._slots
        pid = os.fork()
        if pid == 0:
            ok = len(s.client._endpoint.http_session._manager.pools) == 0 and s._slots is not slots
            ok = ok and all(s.get_bytes("a") == b"1" * 1000 for _ in range(20))
            os._exit(0 if ok else 3)
        assert all(s.get_bytes("a") == b"1" * 1000 for _ in range(20))
        sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    """)
    bounded([sys.executable, "-c", code], Path.cwd(), timeout=60)


@pytest.mark.aws
@pytest.mark.slow
def test_a_run_on_an_s3_store(aws, tmp_path):
    aws.client("s3").create_bucket(Bucket="fork-bucket")
    out = run_fork_flow(tmp_path, ["0B", "300KB", "8MB"], STOKER_STORE="s3://fork-bucket/stoker")
    checked(out, "carded", "monitored", "join", "end")


@pytest.mark.slurm
@pytest.mark.slow
def test_a_run_on_slurm(tmp_path, slurm_cluster, monkeypatch):
    """Every task on the localhost Slurm cluster: each node's agent is forked by its supervisor (slurm/node.py)."""
    monkeypatch.setenv("STOKER_SHARED_PATHS", str(tmp_path))
    out = run_fork_flow(tmp_path, ["0B", "1KB", "300KB"], "run", "--backend", "slurm", timeout=150)  # 50 s at load 12
    assert "succeeded" in out, out[-4000:]
    monkeypatch.setenv("STOKER_HOME", str(tmp_path / "home"))
    from stoker import Flow

    run = Flow("ForkSafetyFlow").latest_run  # each task's log from the store (the console's copy is best effort)
    checked("".join(run[s].task.stdout for s in ("carded", "monitored", "join", "end")), "carded", "monitored",
            "join", "end")


@pytest.mark.torch
@pytest.mark.slow
def test_a_warm_rank_runs_torch_and_hashes(tmp_path):
    """A gang with a spare: its rank is forked by the warm launcher (zygote) after it imported torch."""
    pytest.importorskip("torch")
    out = bounded([sys.executable, str(FLOWS / "fork_warm_flow.py"), "run"], tmp_path,
                  {"STOKER_HOME": str(tmp_path / "home")})
    assert "forked from the warm launcher" in out and "fork_warm_worker: rank 0" in out, out[-4000:]
    assert "fork_warm_flow: done" in out
