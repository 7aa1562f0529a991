#!/usr/bin/env python3
"""Which torch scripts/setup installs, and from where. Run with the Python that stoker is installed into; prints the
arguments for `python -m pip install`, one per line (nothing: torch is installed already and is kept), and says
why on stderr. Standard library only, and it imports no torch (fast).

    torch installed (any build: CUDA, Neuron, CPU)  -> nothing: it is kept
    no torch, an NVIDIA driver (nvidia-smi on PATH,  -> torch==2.13.0 from pip's configuration (PyPI: the CUDA build)
      or /proc/driver/nvidia)
    no torch, no NVIDIA driver, Linux                -> torch==2.13.0+cpu from the CPU index, when it answers
                                                        within STOKER_TORCH_PROBE_TIMEOUT (3 s); otherwise
                                                        torch==2.13.0+cpu from pip's configuration (which fails,
                                                        saying what to do, where pip has no CPU build: never CUDA)
    no torch, macOS / Windows                        -> torch==2.13.0 from pip's configuration (PyPI's is CPU-only)

Neuron devices (/dev/neuron*) without torch count as "no NVIDIA driver" (torch-neuronx runs on the CPU build; its
own install pins a torch version, see the note printed).

The CPU build is asked for by its exact version, `torch==2.13.0+cpu`: only that file matches, so whatever index pip
reads, it cannot pick the CUDA build instead. The CPU index is passed as `--index-url` (PyTorch's documented form),
so torch's own dependencies (filelock, sympy, networkx, jinja2, fsspec, ...) come from it too, which serves them
for this purpose; scripts/setup installs torch in a step of its own so nothing else is looked up there.

Environment:
    STOKER_TORCH_INDEX          the CPU index (default https://download.pytorch.org/whl/cpu; a mirror of it works,
                                file:// too); "pip": don't probe, use pip's configuration
    STOKER_TORCH_BUILD          "cpu" or "default" (PyPI's build: CUDA on Linux): skip the detection
    STOKER_TORCH_PROBE_TIMEOUT  seconds to wait for the CPU index (default 3)
    STOKER_DEVICE_ROOT          where /proc/driver/nvidia and /dev/neuron* are looked for (default /)
    STOKER_NVIDIA_SMI           the nvidia-smi looked for (default: nvidia-smi on PATH); these two are the fakes
                                that tests/unit/test_setup_install.py uses for "a machine with/without a GPU"
"""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os
import shutil
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request

TORCH_VERSION = "2.13.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
CPU_WHEEL_MB = 190  # torch-2.13.0+cpu-cp311 manylinux x86_64: 192 MB; about 0.8 GB installed


def say(msg: str) -> None:
    print(f"scripts/setup: {msg}", file=sys.stderr, flush=True)


def installed_torch() -> str | None:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:  # a torch without pip's metadata (a source build) counts too
        return "(version unknown)" if importlib.util.find_spec("torch") else None


def devices(root: str, smi_name: str = "nvidia-smi") -> tuple[str | None, str | None]:
    """(why we think there is an NVIDIA driver, why we think there are Neuron devices), None where not."""
    nvidia = None
    smi = shutil.which(smi_name)
    if smi:
        nvidia = f"{smi} is on PATH"
    elif os.path.isdir(os.path.join(root, "proc/driver/nvidia")):
        nvidia = f"{os.path.join(root, 'proc/driver/nvidia')} exists"
    neuron = sorted(glob.glob(os.path.join(root, "dev/neuron[0-9]*")))
    return nvidia, (f"{neuron[0]} exists" if neuron else None)


def probe(index: str, timeout: float) -> str | None:
    """None when `<index>/torch/` answers within `timeout` seconds (DNS included), else why not."""
    url = index.rstrip("/") + "/torch/"
    if url.startswith("file:"):
        path = urllib.request.url2pathname(urllib.parse.urlparse(url).path)
        return None if os.path.isdir(path) else f"{path} is not a folder"
    result: list[str | None] = [f"no answer in {timeout:g}s"]

    def ask() -> None:
        for method in ("HEAD", "GET"):  # GET where a server refuses HEAD; only its headers are read
            try:
                req = urllib.request.Request(url, method=method, headers={"User-Agent": "stoker-setup"})
                with urllib.request.urlopen(req, timeout=timeout) as r:
                    result[0] = None if r.status < 400 else f"HTTP {r.status}"
                return
            except urllib.error.HTTPError as e:
                result[0] = f"HTTP {e.code}"
                if e.code not in (403, 405, 501):
                    return
            except Exception as e:  # DNS, refused, TLS, timeout: all mean "use pip's configuration"
                result[0] = str(getattr(e, "reason", None) or e) or type(e).__name__
                return

    t = threading.Thread(target=ask, daemon=True)  # a thread: getaddrinfo() has no timeout of its own
    t.start()
    t.join(timeout)
    return result[0]


def choose(env: dict[str, str] | None = None) -> list[str]:
    env = os.environ if env is None else env
    have = installed_torch()
    if have:
        say(f"keeping the installed torch {have} ({sys.executable})")
        return []
    build = env.get("STOKER_TORCH_BUILD", "").strip().lower()
    if build not in ("", "cpu", "default"):
        raise SystemExit(f"scripts/setup: STOKER_TORCH_BUILD={build!r}: expected 'cpu' or 'default'")
    nvidia, neuron = devices(env.get("STOKER_DEVICE_ROOT") or "/", env.get("STOKER_NVIDIA_SMI") or "nvidia-smi")
    default = [f"torch=={TORCH_VERSION}"]
    if build == "default" or (not build and nvidia):
        why = "STOKER_TORCH_BUILD=default" if build else f"an NVIDIA driver ({nvidia})"
        say(f"{why}: installing torch {TORCH_VERSION}, the default build, from pip's configured index (PyPI: the "
            "CUDA 13 build with about 16 nvidia-* packages, several GB to download; for another CUDA version "
            "install torch yourself first, e.g. from https://download.pytorch.org/whl/cu126, and it is kept)")
        return default
    if not build and not sys.platform.startswith("linux"):
        say(f"no NVIDIA driver: installing torch {TORCH_VERSION} from pip's configured index (on {sys.platform} "
            "that is the CPU build)")
        return default
    why = "STOKER_TORCH_BUILD=cpu" if build else "no NVIDIA driver (no nvidia-smi, no /proc/driver/nvidia)"
    if neuron and not build:
        why = f"Neuron devices ({neuron}) and no torch"
        say("note: for the Neuron devices install torch-neuronx first (https://awsdocs-neuron.readthedocs-hosted.com;"
            " it pins its own torch, which is then kept); meanwhile stoker gets the CPU build")
    spec = f"torch=={TORCH_VERSION}+cpu"
    index = env.get("STOKER_TORCH_INDEX", CPU_INDEX).strip()
    size = f"about {CPU_WHEEL_MB} MB to download, 0.8 GB installed"
    if index.lower() in ("pip", "none", ""):
        say(f"{why}: installing torch {TORCH_VERSION}, the CPU build, from pip's configuration "
            f"(STOKER_TORCH_INDEX={index}; {size})")
        return [spec]
    timeout = float(env.get("STOKER_TORCH_PROBE_TIMEOUT") or 3)
    failed = probe(index, timeout)
    if failed is None:
        say(f"{why}: installing torch {TORCH_VERSION}, the CPU build, from {index} ({size})")
        return [spec, "--index-url", index]
    say(f"{why}: the PyTorch CPU index {index} did not answer ({failed}); installing torch {TORCH_VERSION}, "
        f"the CPU build, from pip's configuration instead ({size}). If pip has no CPU build of torch there, it "
        "stops: then set STOKER_TORCH_INDEX to a mirror of that index, or install torch yourself and rerun")
    return [spec]


if __name__ == "__main__":
    for arg in choose():
        print(arg)
