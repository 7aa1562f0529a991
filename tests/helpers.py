"""Shared test helpers: run a flow file as a user would (`python flow.py ...`) in a scratch folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOWS = ROOT / "tests" / "flows"
EXAMPLES = ROOT / "examples"


def run_flow(flow: str | Path, *args: str, cwd: Path, env: dict | None = None, timeout: float = 240,
             check: bool | None = True) -> subprocess.CompletedProcess:
    path = Path(flow) if Path(flow).is_absolute() else FLOWS / flow
    p = subprocess.run([sys.executable, str(path), *args], cwd=cwd, capture_output=True, text=True,
                       timeout=timeout, env={**os.environ, **(env or {})})
    if check and p.returncode != 0:
        raise AssertionError(f"{path.name} {' '.join(args)} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p
