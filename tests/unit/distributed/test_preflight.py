"""The gang preflight's checks, each with its commands, paths, disk probe and all_reduce launcher injected: a
failure names the node (index and host), the check and the fix, and is permanent (never retried)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from stoker.distributed.preflight import (
    MIN_BUSBW_ENV,
    MIN_DISK_ENV,
    PREFLIGHT_LINE,
    Preflight,
    PreflightError,
    enabled,
    gate,
    min_busbw,
    run_command,
)
from stoker.errors import EXIT_PERMANENT
from stoker.exitstatus import exit_code_for
from stoker.train.collectives import pick_backend


def tools(tmp_path: Path, *names: str) -> str:
    """A PATH folder with stand-ins for `names` (the injected runner answers for them; they never run)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for n in names:
        p = bin_dir / n
        p.write_text("#!/bin/sh\nexit 99\n")
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return str(bin_dir)


class Commands:
    """An injected CommandRunner: canned (rc, output) by program name; records the calls."""

    def __init__(self, **answers: tuple[int, str]) -> None:
        self.answers, self.calls = answers, []

    def __call__(self, argv, env):
        self.calls.append(list(argv))
        return self.answers.get(Path(argv[0]).name.replace("-", "_"), (0, ""))


def make(tmp_path, *, run=None, lines=None, **kw) -> Preflight:
    kw.setdefault("env", {"PATH": tools(tmp_path)})
    kw.setdefault("free_bytes", lambda path: 500 * 10**9)
    lines = [] if lines is None else lines
    return Preflight(node=1, nnodes=2, host="node-b", run=run or Commands(), out=lines.append,
                     tempdir=str(tmp_path), **kw)


def failed(check: Preflight, nproc: int = 1) -> PreflightError:
    with pytest.raises(PreflightError) as e:
        check(nproc)
    msg = str(e.value)
    assert "node 1 (node-b)" in msg and "--no-preflight" in msg
    return e.value


# -- 1. accelerators ----------------------------------------------------------------------------------------
def neuron_devs(tmp_path: Path, n: int) -> str:
    dev = tmp_path / "dev"
    dev.mkdir(exist_ok=True)
    for i in range(n):
        (dev / f"neuron{i}").touch()
    return str(dev)


def test_missing_neuron_devices_fail_naming_node_and_check(tmp_path):
    lines: list[str] = []
    err = failed(make(tmp_path, request={"trainium": 16}, dev_dir=neuron_devs(tmp_path, 4), lines=lines))
    assert err.check == "accelerators" and "asks for 16 Neuron devices but" in str(err) and "has 4" in str(err)
    assert lines and lines[0].startswith("preflight: node 1 (node-b) failed in ") and "accelerators" in lines[0]


def test_neuron_ls_must_work(tmp_path):
    env = {"PATH": tools(tmp_path, "neuron-ls")}
    run = Commands(neuron_ls=(1, "nrt: failed to open /dev/neuron0"))
    err = failed(make(tmp_path, request={"trainium": 2}, dev_dir=neuron_devs(tmp_path, 2), env=env, run=run))
    assert err.check == "accelerators" and "`neuron-ls` exited 1" in str(err) and "driver" in str(err)
    ok = make(tmp_path, request={"trainium": 2}, dev_dir=neuron_devs(tmp_path, 2), env=env)
    assert ok.accelerators() == "2 neuron devices"


def test_too_few_gpus_fail(tmp_path):
    env = {"PATH": tools(tmp_path, "nvidia-smi")}
    run = Commands(nvidia_smi=(0, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n"))
    err = failed(make(tmp_path, request={"gpu": 8}, env=env, run=run))
    assert err.check == "accelerators" and "asks for 8 GPUs but nvidia-smi lists 1" in str(err)


def test_gpu_step_on_a_node_without_nvidia_smi(tmp_path):
    err = failed(make(tmp_path, request={"gpu": 1}))
    assert "nvidia-smi is not on PATH" in str(err)


# -- 2. EFA -------------------------------------------------------------------------------------------------
FI_INFO = "".join(f"provider: efa\n    fabric: efa\n    domain: rdmap{i}s0-{kind}\n"
                  for i in range(2) for kind in ("rdm", "dgrm"))


def test_fi_info_failing_fails_efa(tmp_path):
    env = {"PATH": tools(tmp_path, "fi_info")}
    run = Commands(fi_info=(61, "fi_getinfo: -61 (No data available)"))
    err = failed(make(tmp_path, request={"efa": 8}, env=env, run=run))
    assert err.check == "efa" and "`fi_info -p efa` exited 61" in str(err) and "No data available" in str(err)


def test_fi_info_listing_fewer_interfaces_than_asked(tmp_path):
    env = {"PATH": tools(tmp_path, "fi_info")}
    err = failed(make(tmp_path, request={"efa": 8}, env=env, run=Commands(fi_info=(0, FI_INFO))))
    assert "asks for 8 EFA interfaces but fi_info lists 2" in str(err)
    assert make(tmp_path, request={"efa": 2}, env=env, run=Commands(fi_info=(0, FI_INFO))).efa() == \
        "efa ok (2 interfaces)"


def test_no_efa_asked_runs_no_fi_info(tmp_path):
    run = Commands()
    make(tmp_path, run=run)(1)
    assert not any("fi_info" in c[0] for c in run.calls)


# -- 3. imports (the node's real Python, through the default runner) -------------------------------------
def test_a_scripts_missing_import_is_named(tmp_path):
    (tmp_path / "helper.py").write_text("X = 1\n")
    script = tmp_path / "train.py"
    script.write_text("import os\nimport helper\nfrom no_such_module_xyz.sub import thing\n"
                      "try:\n    import optional_missing_abc\nexcept ImportError:\n    pass\n")
    err = failed(make(tmp_path, entrypoint=str(script), run=run_command, env=dict(os.environ)))
    assert err.check == "imports" and "no_such_module_xyz" in str(err)
    assert "helper" not in str(err).split("needs")[1], "the script's folder is searched first"
    assert "optional_missing_abc" not in str(err), "only top-level imports"


def test_a_missing_script_and_a_missing_module(tmp_path):
    err = failed(make(tmp_path, entrypoint=str(tmp_path / "nope.py"), run=run_command, env=dict(os.environ)))
    assert "does not exist" in str(err)
    err = failed(make(tmp_path, entrypoint="stoker.no_such_entrypoint", run=run_command, env=dict(os.environ)))
    assert "`python -m stoker.no_such_entrypoint` needs stoker.no_such_entrypoint" in str(err)


def test_a_module_entrypoint_that_resolves(tmp_path):
    check = make(tmp_path, entrypoint="stoker.train.collectives", run=run_command, env=dict(os.environ))
    assert check.imports() == "imports ok"


# -- 4. staged data ---------------------------------------------------------------------------------------
def test_missing_or_empty_staged_data(tmp_path):
    (tmp_path / "empty").mkdir()
    err = failed(make(tmp_path, data_paths=[str(tmp_path / "absent")]))
    assert err.check == "staged data" and "absent is missing" in str(err)
    err = failed(make(tmp_path, data_paths=[str(tmp_path / "empty")]))
    assert "empty is empty" in str(err)
    (tmp_path / "shard.bin").write_bytes(b"x")
    assert make(tmp_path, data_paths=[str(tmp_path / "shard.bin")]).data() == "data ok (1 paths)"


# -- 5. disk ----------------------------------------------------------------------------------------------
def test_low_disk_for_the_neuron_cache(tmp_path):
    cache = tmp_path / "cache"
    seen: list[str] = []

    def free(path):
        seen.append(path)
        return 3 * 10**9

    env = {"PATH": "", "NEURON_COMPILE_CACHE_URL": str(cache)}
    err = failed(make(tmp_path, neuron=True, env=env, free_bytes=free))
    assert err.check == "disk" and "3.0 GB free, below the floor of 20 GB" in str(err) and seen == [str(cache)]
    assert make(tmp_path, neuron=True, env={**env, MIN_DISK_ENV: "2"}, free_bytes=free).disk() == "disk 3 GB free"


def test_off_neuron_the_disk_is_only_reported(tmp_path):
    assert make(tmp_path, free_bytes=lambda p: 10**8).disk() == "disk 0 GB free"
    err = failed(make(tmp_path, free_bytes=lambda p: 10**8, env={MIN_DISK_ENV: "1"}))
    assert "task's temp folder" in str(err)


# -- 6. all_reduce ----------------------------------------------------------------------------------------
class AllReduce:
    """An injected launcher: writes what --node-out asks, with this bus bandwidth, and returns `rc`."""

    def __init__(self, busbw: float, rc: int = 0) -> None:
        self.busbw, self.rc, self.cmds = busbw, rc, []

    def __call__(self, cmd, env, timeout):
        self.cmds.append(list(cmd))
        if self.rc == 0:
            out = cmd[cmd.index("--node-out") + 1]
            Path(out).write_text(json.dumps({"world_size": 4, "backend": "nccl", "results": [
                {"bytes": 1 << 28, "latency_us": 1.0, "algbw_gbps": 1.0, "busbw_gbps": self.busbw}]}))
        return self.rc


def torchrun_like(extra):
    return ["torchrun", "--nnodes=2", "-m", "stoker.train.collectives", *extra]


def test_all_reduce_below_the_floor_names_measured_and_required(tmp_path):
    launcher = AllReduce(busbw=1.5)
    lines: list[str] = []
    err = failed(make(tmp_path, instance_type="trn1.32xlarge", allreduce_command=torchrun_like, launch=launcher,
                      lines=lines), nproc=2)
    assert err.check == "all_reduce"
    assert "1.50 GB/s" in str(err) and "below the required 10 GB/s (trn1.32xlarge)" in str(err)
    assert "--sizes" in launcher.cmds[0] and "--backend" in launcher.cmds[0]
    assert PREFLIGHT_LINE.match(lines[-1]).groups()[:3] == ("1", "node-b", "failed")


def test_all_reduce_floor_from_the_environment(tmp_path):
    err = failed(make(tmp_path, env={"PATH": "", MIN_BUSBW_ENV: "1e9"}, allreduce_command=torchrun_like,
                      launch=AllReduce(busbw=50.0)))
    assert "below the required 1e+09 GB/s (STOKER_PREFLIGHT_MIN_BUSBW_GBPS)" in str(err)


def test_a_failed_all_reduce(tmp_path):
    err = failed(make(tmp_path, allreduce_command=torchrun_like, launch=AllReduce(busbw=0, rc=1)), nproc=2)
    assert err.check == "all_reduce" and "across 2 nodes x 2 processes failed (torchrun exited 1" in str(err)


def test_every_check_passing_prints_one_line_with_the_time(tmp_path):
    ticks = iter([10.0, 14.25])
    (tmp_path / "data").write_bytes(b"tokens")
    lines: list[str] = []
    env = {"PATH": tools(tmp_path, "nvidia-smi", "fi_info")}
    run = Commands(nvidia_smi=(0, "GPU 0: A\nGPU 1: B\n"), fi_info=(0, FI_INFO))
    took = make(tmp_path, request={"gpu": 2, "efa": 2}, instance_type="p5.48xlarge", env=env, run=run,
                data_paths=[str(tmp_path / "data")], allreduce_command=torchrun_like, launch=AllReduce(busbw=80.0),
                clock=lambda: next(ticks), lines=lines)(2)
    assert took == pytest.approx(4.25)
    assert lines == ["preflight: node 1 (node-b) ok in 4.2 s: 2 GPUs, efa ok (2 interfaces), data ok (1 paths), "
                     "disk 500 GB free, all_reduce 80.00 GB/s ≥ 40 (nccl); 3 Pythons started"]
    node, host, verdict, seconds = PREFLIGHT_LINE.match(lines[0]).groups()
    assert (node, host, verdict, float(seconds)) == ("1", "node-b", "ok", 4.2)


# -- switches, floors, the error's kind -------------------------------------------------------------------
def test_enabled_by_default_for_gangs_and_switchable():
    assert enabled(2, None, {}) and not enabled(1, None, {})
    assert not enabled(4, None, {"STOKER_PREFLIGHT": "0"}), "run --no-preflight"
    assert not enabled(4, True, {"STOKER_PREFLIGHT": "0"}), "the operator's --no-preflight wins"
    assert not enabled(4, False, {}) and enabled(1, True, {}) and enabled(1, None, {"STOKER_PREFLIGHT": "1"})


def test_floors():
    assert min_busbw("p5.48xlarge", "gpu", {}) == (40.0, "p5.48xlarge")
    assert min_busbw(None, "cpu", {}) == (0.0, "CPU default")
    assert min_busbw("g5.xlarge", "gpu", {})[0] == 0.0
    assert min_busbw("trn1.32xlarge", "neuron", {MIN_BUSBW_ENV: "3"}) == (3.0, MIN_BUSBW_ENV)


def test_a_preflight_failure_is_permanent():
    err = PreflightError(3, "ip-10-0-0-7", "efa", "fi_info failed", "attach EFA")
    assert err.permanent and exit_code_for(err) == EXIT_PERMANENT
    assert str(err).startswith("preflight failed on node 3 (ip-10-0-0-7), check efa: fi_info failed; attach EFA")


class FakeHelper:
    nnodes, node_rank, master_port = 1, 0, 29500
    request: dict = {}


def test_on_one_host_the_all_reduce_is_skipped_and_one_python_started(tmp_path):
    """Every node on this machine (a local gang): the all_reduce would test loopback for the price of a torchrun and
    nproc Pythons importing torch; the imports check (one short Python) and the other local checks stay."""
    launcher, run, lines = AllReduce(busbw=1.0), Commands(python=(0, '{"missing": [], "error": null}')), []
    make(tmp_path, one_host=True, entrypoint="stoker.train", python="python", run=run, allreduce_command=torchrun_like,
         launch=launcher, lines=lines)(2)
    assert launcher.cmds == [] and [c[0] for c in run.calls] == ["python"]
    assert "imports ok" in lines[0] and "disk 500 GB free" in lines[0], lines
    assert lines[0].endswith("all_reduce skipped (every node is on this machine); 1 Python started"), lines
    for env in ({MIN_BUSBW_ENV: "0.5"}, {"STOKER_PREFLIGHT_ALLREDUCE": "1"}):  # asked for: it runs there too
        launcher, lines = AllReduce(busbw=1.0), []
        make(tmp_path, one_host=True, env={"PATH": tools(tmp_path), **env}, allreduce_command=torchrun_like,
             launch=launcher, lines=lines)(2)
        assert len(launcher.cmds) == 1 and lines[0].endswith("; 3 Pythons started"), lines


def test_gate_sees_a_loopback_rendezvous_as_one_host():
    from stoker.distributed.accel import on_this_host

    assert on_this_host("127.0.0.1") and on_this_host("localhost") and on_this_host("::1")
    assert not on_this_host("10.0.0.7") and not on_this_host("node-a")


def test_gate_is_off_for_one_node_unless_asked():
    assert gate(FakeHelper(), "stoker.train", None, 1, {}) is None
    assert gate(FakeHelper(), "stoker.train", None, 1, {"STOKER_PREFLIGHT": "0"}, asked=True) is None


def test_collectives_backend_choice():
    assert pick_backend("auto", cuda=True, xla=True, neuron=True) == "nccl"
    assert pick_backend("auto", cuda=False, xla=True, neuron=True) == "xla"
    assert pick_backend("auto", cuda=False, xla=False, neuron=True) == "gloo"
    assert pick_backend("auto", cuda=False, xla=True, neuron=False) == "gloo"
    assert pick_backend("gloo", cuda=True) == "gloo"


def test_run_no_preflight_is_a_run_and_resume_option():
    from stoker import FlowSpec, step
    from stoker.cli.flow_cli import build_parser

    class Tiny(FlowSpec):
        @step
        def start(self):
            self.next(self.end)

        @step
        def end(self):
            pass

    parser = build_parser(Tiny)
    assert parser.parse_args(["run", "--no-preflight"]).no_preflight
    assert not parser.parse_args(["run"]).no_preflight
    assert parser.parse_args(["resume", "--no-preflight"]).no_preflight
    from stoker.runtime.driver.jobs import run_env

    os.environ["STOKER_PREFLIGHT"] = "0"
    try:  # every unit carries the run's switches in its environment (a Batch node's SubmitJob overrides)
        assert run_env()["STOKER_PREFLIGHT"] == "0"
    finally:
        del os.environ["STOKER_PREFLIGHT"]
