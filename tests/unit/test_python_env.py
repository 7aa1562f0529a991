"""scripts/python-env, which the README's two commands (`make quickstart`, `make test`) and scripts/setup use to
pick the Python to install into: $PYTHON, else the user's activated venv or conda env (kept), else the
project's .venv (what a stock, externally managed Debian/Ubuntu python3 needs). CI runs the .venv path for real
(.ci/run puts Debian's /usr/bin/python3 first on PATH); this checks each choice without installing anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "python-env"


def pick(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "VIRTUAL_ENV", "CONDA_PREFIX")}
    return subprocess.run(["bash", str(SCRIPT)], env={**base, **env}, capture_output=True, text=True, cwd=tmp_path)


def fake_env(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    py = root / "bin" / "python"
    py.symlink_to(sys.executable)
    return py


def test_an_activated_venv_is_kept(tmp_path):
    venv = tmp_path / "myvenv"
    fake_env(venv)
    r = pick(tmp_path, VIRTUAL_ENV=str(venv))
    assert r.returncode == 0 and r.stdout.strip() == f"{venv}/bin/python"


def test_an_activated_conda_env_is_kept(tmp_path):
    conda = tmp_path / "conda"
    fake_env(conda)
    r = pick(tmp_path, CONDA_PREFIX=str(conda))
    assert r.returncode == 0 and r.stdout.strip() == f"{conda}/bin/python"


def test_without_an_env_the_projects_venv(tmp_path):
    r = pick(tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == f"{ROOT}/.venv/bin/python"


def test_a_venv_variable_without_its_python_falls_back_to_the_projects_venv(tmp_path):
    r = pick(tmp_path, VIRTUAL_ENV=str(tmp_path / "gone"))
    assert r.stdout.strip() == f"{ROOT}/.venv/bin/python"


def test_python_overrides_and_a_wrong_one_is_named(tmp_path):
    r = pick(tmp_path, PYTHON=sys.executable, VIRTUAL_ENV=str(tmp_path))
    assert r.returncode == 0 and r.stdout.strip() == sys.executable
    r = pick(tmp_path, PYTHON="no-such-python3")
    assert r.returncode != 0 and "PYTHON=no-such-python3 is not a Python on PATH" in r.stderr
