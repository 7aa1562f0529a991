"""Warm ranks (distributed/warm.py, distributed/zygote.py): a gang with spares forks each generation's ranks from a
process that imported torch and the entrypoint once. Real processes, real fork, a real gloo process group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from stoker.distributed.warm import WarmLauncher, close_all, rank_env, zygote_env
from stoker.distributed.zygote import entry_imports

ENTRY = textwrap.dedent('''
    import os, random, signal, sys, time
    import torch
    import torch.distributed as dist

    def main():
        mode = os.environ.get("MODE", "ok")
        if mode == "ok":
            dist.init_process_group("gloo")
            x = torch.ones(1) * (dist.get_rank() + 1)
            dist.all_reduce(x)
            with open("/proc/self/comm") as f:
                comm = f.read().strip()
            big = sum(len(os.environ.get(k, "")) for k in ("BIG1", "BIG2"))
            print(f"rank={os.environ['RANK']} local={os.environ['LOCAL_RANK']} world={os.environ['WORLD_SIZE']} "
                  f"node={os.environ['GROUP_RANK']} sum={x.item():.0f} argv={sys.argv[1:]} cwd={os.getcwd()} "
                  f"comm={comm} random={random.random():.12f} big={big} "
                  f"main={__name__}", flush=True)
            print(f"err from {os.environ['RANK']}", file=sys.stderr, flush=True)
            dist.destroy_process_group()
        elif mode == "fail":
            if os.environ["LOCAL_RANK"] == "1":
                sys.exit(3)
            time.sleep(60)
        elif mode == "preempt":
            signal.signal(signal.SIGTERM, lambda *a: sys.exit(75))
            print("ready", flush=True)
            time.sleep(60)
        elif mode == "quick":  # no process group: what a forked rank is, and how it ends
            import concurrent.futures, resource
            import cfg  # the entrypoint's own module, next to it: imported by the rank, never by the launcher
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            print(f"rank={os.environ['RANK']} cfg={cfg.RANK} session={os.getsid(0) == os.getpid()} "
                  f"nofile={soft == hard}", flush=True)
            global EXECUTOR, OUT
            EXECUTOR = concurrent.futures.ThreadPoolExecutor(1)  # never shut down: Python's exit ends its thread
            EXECUTOR.submit(print, "executor ran", flush=True)
            OUT = open(f"out-{os.environ['RANK']}.txt", "w")  # never closed: Python's exit flushes it
            OUT.write("written")
        elif mode == "sleep":
            print(f"pid={os.getpid()}", flush=True)
            time.sleep(60)

    if __name__ == "__main__":
        main()
''')


@pytest.fixture
def entry(tmp_path: Path) -> Path:
    path = tmp_path / "entry.py"
    path.write_text(ENTRY)
    yield path
    close_all()


def _launch(w: WarmLauncher, entry: Path, port: int, mode: str = "ok", nproc: int = 2, **env: str):
    ranks = [rank_env(0, 1, nproc, i, "127.0.0.1", port) for i in range(nproc)]
    return w.launch(module=None, script=str(entry), args=["--gen", str(port)], env={**zygote_env(os.environ),
                    "MODE": mode, **env}, ranks=ranks, cwd=str(entry.parent), tee=True, grace=5.0)


def _site(tmp_path: Path, files: dict[str, str]) -> Path:
    """A folder of installed modules (on PYTHONPATH, not next to the entrypoint: those are its own, never preloaded)."""
    site = tmp_path.parent / f"{tmp_path.name}-site"
    for name, text in files.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    return site


def _with_path(site: Path) -> dict[str, str]:
    env = zygote_env(os.environ)
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_each_generation_forks_ranks_with_torchruns_environment(entry, capfd):
    w = WarmLauncher.get(zygote_env(os.environ), str(entry.parent))
    w.preload(None, str(entry))
    loaded = w.ready()
    assert {"torch", "torch.distributed"} <= set(loaded["loaded"]) and loaded["threads"] == 1, loaded
    outs = []
    for gen in range(2):  # two generations from the same launcher; the second's environment is too long for a message
        port = _free_port()
        t0 = time.monotonic()
        big = {"BIG1": "x" * 100_000, "BIG2": "y" * 100_000} if gen else {}
        ranks = _launch(w, entry, port, **big)
        assert not ranks.fresh
        assert ranks.wait(60) == 0
        assert time.monotonic() - t0 < 10
        out, err = capfd.readouterr()
        outs.append(out)
        for r in (0, 1):
            line = next(x for x in out.splitlines() if x.startswith(f"[default{r}]:rank={r} "))
            assert f"local={r} world=2 node=0 sum=3 argv=['--gen', '{port}'] cwd={entry.parent} " \
                   f"comm=stoker-rank{r}" in line and line.endswith(f"big={200_000 if gen else 0} main=__main__"), line
            assert f"[default{r}]:err from {r}" in err
    randoms = [x.split("random=")[1].split()[0] for out in outs for x in out.splitlines() if "random=" in x]
    assert len(set(randoms)) == 4, randoms  # each rank seeds anew: not the zygote's copy
    assert w.alive()


def test_a_failing_rank_stops_the_others_on_its_node(entry, capfd):
    w = WarmLauncher.get(zygote_env(os.environ), str(entry.parent))
    t0 = time.monotonic()
    ranks = _launch(w, entry, _free_port(), mode="fail")
    assert ranks.wait(30) == 1
    assert time.monotonic() - t0 < 20  # rank 0 would sleep 60 s
    assert ranks.exits == {1: 3, 0: -signal.SIGTERM}
    ranks.finish(False, node=1)
    assert ranks.codes == {3}  # rank 0 was stopped by stoker: not its own failure
    err = capfd.readouterr().err
    assert "torchrun: node 1: rank 1 failed (exitcode: 3): exit code 3" in err, err
    assert "torchrun: node 1: rank 0 stopped by stoker" in err and "rank 0 failed" not in err, err


def test_a_preemption_reaches_the_ranks_and_ends_in_one_line(entry, capfd):
    w = WarmLauncher.get(zygote_env(os.environ), str(entry.parent))
    ranks = _launch(w, entry, _free_port(), mode="preempt")
    deadline, said = time.monotonic() + 30, ""
    while (said := said + capfd.readouterr().out).count("ready") < 2:
        assert time.monotonic() < deadline, said
        with pytest.raises(subprocess.TimeoutExpired):
            ranks.wait(0.2)
    os.kill(w.proc.pid, signal.SIGTERM)  # scancel signals every process of the step: the launcher is not for it
    ranks.term_workers()
    assert ranks.wait(30) == 1 and ranks.exits == {0: 75, 1: 75}
    assert w.alive()
    ranks.finish(True, node=0)
    err = capfd.readouterr().err
    assert "every worker stopped after a preemption" in err and "failed" not in err, err


def test_the_ranks_die_with_their_owner(entry, tmp_path):
    """The owner (a task process) is SIGKILLed, as a lost node's processes are: its launcher and ranks go too."""
    script = tmp_path / "owner.py"
    script.write_text(textwrap.dedent(f'''
        import os, time
        from stoker.distributed.warm import WarmLauncher, rank_env, zygote_env
        env = {{**zygote_env(os.environ), "MODE": "sleep"}}
        w = WarmLauncher.get(env, {str(entry.parent)!r})
        r = w.launch(module=None, script={str(entry)!r}, args=[], env=env, cwd={str(entry.parent)!r}, tee=True,
                     grace=5.0, ranks=[rank_env(0, 1, 2, i, "127.0.0.1", {_free_port()}) for i in range(2)])
        print("zygote", w.proc.pid, "ranks", *r.pids, flush=True)
        time.sleep(60)
    '''))
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        line = next(x for x in owner.stdout if x.startswith("zygote ")).split()  # type: ignore[union-attr]
        pids = [int(line[1]), int(line[3]), int(line[4])]  # (the ranks' own lines come on the same stdout)
        assert all(psutil.pid_exists(p) for p in pids)
    finally:
        owner.kill()
        owner.wait()
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.05)
    assert not alive


def test_a_zygote_with_threads_starts_ranks_as_new_processes(entry, capfd, tmp_path):
    """Forking a process with a second thread is not safe: an entrypoint whose imports start one gets new Pythons
    (as does STOKER_WARM_RANKS=0), with the same environment and output."""
    site = _site(tmp_path, {"threaded.py": "import threading, time\n"
                                          "threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"})
    entry.write_text("import threaded\n" + ENTRY)
    w = WarmLauncher.get(_with_path(site), str(entry.parent))
    w.preload(None, str(entry))
    assert w.ready()["threads"] == 2
    ranks = _launch(w, entry, _free_port(), PYTHONPATH=_with_path(site)["PYTHONPATH"])
    assert ranks.fresh and ranks.wait(120) == 0
    out = capfd.readouterr().out
    assert "[default1]:rank=1 local=1 world=2" in out and "comm=python" in out, out


def test_warm_ranks_can_be_turned_off(entry, capfd):
    w = WarmLauncher.get(zygote_env(os.environ), str(entry.parent))
    ranks = _launch(w, entry, _free_port(), nproc=1, STOKER_WARM_RANKS="0")
    assert ranks.fresh and ranks.wait(120) == 0
    assert "[default0]:rank=0 local=0 world=1" in capfd.readouterr().out


def test_what_the_zygote_imports_is_read_from_the_entrypoint(tmp_path):
    assert {"stoker.train.trainer", "stoker.train.config"} <= set(entry_imports("stoker.train", None))
    script = tmp_path / "nxd.py"
    script.write_text("import os\nimport torch_xla.core.xla_model as xm\nfrom . import x\n"
                      "def main():\n    from neuronx_distributed import parallel_layers\n    import transformers\n")
    assert entry_imports(None, str(script)) == ["torch", "torch.distributed", "os", "transformers"]
    (tmp_path / "broken.py").write_text("def (:\n")
    assert entry_imports(None, str(tmp_path / "broken.py")) == ["torch", "torch.distributed"]
    assert entry_imports("no_such_module_here", None) == ["torch", "torch.distributed"]


def test_a_launcher_whose_environment_changed_is_started_again(entry, capfd):
    """What the launcher imported may have read the environment (a library's settings at import): a launch in
    another environment gets a new launcher, and the log names the variables. The variables of one launch or task
    (the rank's, stoker's, torchrun's, MF_PARALLEL_*) do not count."""
    base = zygote_env(os.environ)
    w = WarmLauncher.get(base, str(entry.parent))
    same = {**base, "RANK": "3", "MASTER_PORT": "1", "STOKER_RUN_ID": "9", "MF_PARALLEL_NODE_INDEX": "1",
            "TORCHELASTIC_RUN_ID": "x"}
    assert WarmLauncher.get(same, str(entry.parent)) is w and w.alive()
    other = {**same, "HF_HUB_OFFLINE": "1"}
    other.pop("HOME", None)
    w2 = WarmLauncher.get(other, str(entry.parent))
    assert w2 is not w and not w.alive() and w2.alive()
    assert "the warm launcher is started again: HF_HUB_OFFLINE, HOME changed" in capfd.readouterr().err
    assert WarmLauncher.get(other, "/") is not w2  # another folder: modules resolve elsewhere


def test_ranks_stoker_kills_for_a_new_generation_are_not_reported_as_failures(entry, capfd):
    w = WarmLauncher.get(zygote_env(os.environ), str(entry.parent))
    ranks = _launch(w, entry, _free_port(), mode="sleep")
    ranks.kill()
    assert ranks.wait(30) == 1 and ranks.exits == {0: -signal.SIGKILL, 1: -signal.SIGKILL}
    ranks.finish(True, node=1)
    err = capfd.readouterr().err
    assert "torchrun: node 1: ranks 0, 1 stopped by stoker" in err and "failed" not in err, err
    assert ranks.codes == set()  # nothing of their own: not a node fault
    assert w.alive()  # the launcher stays for the next generation


def test_a_device_runtime_imported_by_the_entrypoints_own_module_means_new_processes(entry, capfd, tmp_path):
    """The device runtimes are never imported by the launcher; when an installed module the entrypoint imports
    imports one anyway (here a stand-in package named torch_xla), a fork would not be a clean rank: the launcher
    starts again with nothing imported, and each rank starts a new Python."""
    site = _site(tmp_path, {"torch_xla/__init__.py": "", "model_nxd.py": "import torch_xla\n"})
    entry.write_text("import model_nxd\n" + ENTRY)
    w = WarmLauncher.get(_with_path(site), str(entry.parent))
    w.preload(None, str(entry))
    assert w.ready()["unsafe"] == "torch_xla imported"
    ranks = _launch(w, entry, _free_port(), nproc=1, PYTHONPATH=_with_path(site)["PYTHONPATH"])
    assert ranks.fresh and ranks.wait(120) == 0
    assert "[default0]:rank=0 local=0 world=1" in capfd.readouterr().out


def test_many_ranks_a_node_and_how_a_rank_ends(entry, capfd):
    """40 ranks on a node (a trn2 node runs 64): each is its own session with the raised open-files limit, imports
    the entrypoint's own modules itself (they read its RANK), and ends as Python ends: an executor never shut down
    does not hang it, a file never closed is flushed."""
    (entry.parent / "cfg.py").write_text("import os\nRANK = os.environ.get('RANK')\n")
    assert "cfg" not in entry_imports(None, str(entry), str(entry.parent))
    w = WarmLauncher.get(zygote_env(os.environ), str(entry.parent))
    ranks = _launch(w, entry, _free_port(), mode="quick", nproc=40)
    assert not ranks.fresh and ranks.wait(120) == 0, capfd.readouterr()
    out = capfd.readouterr().out
    for r in range(40):
        assert f"[default{r}]:rank={r} cfg={r} session=True nofile=True" in out, out
        assert (entry.parent / f"out-{r}.txt").read_text() == "written"
    assert out.count("executor ran") == 40


def test_max_restarts_with_spares_is_refused_before_anything_runs():
    """torchrun's in-place restarts do not exist for a gang with spares (its ranks are the warm launcher's): said at
    launch, with the fix, instead of being ignored."""
    from stoker.features.torchrun import TorchrunDecorator

    problem = TorchrunDecorator({"spares": 1, "max_restarts": 2}).plan_problem({}, {})
    assert problem and "max_restarts" in problem and "drop max_restarts (or the spares)" in problem
    assert TorchrunDecorator({"spares": 1}).plan_problem({}, {}) is None
    assert TorchrunDecorator({"max_restarts": 2}).plan_problem({}, {}) is None


def test_the_zygote_leaves_out_the_device_runtimes_the_fork_check_names():
    """The zygote writes the list out (it imports no stoker module before it preloads): it must stay the same."""
    from stoker._process import DEVICE_RUNTIMES
    from stoker.distributed.zygote import NOT_PRELOADED

    assert NOT_PRELOADED == DEVICE_RUNTIMES
