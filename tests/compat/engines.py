"""Run one Metaflow-style flow file on both engines: real Metaflow (a venv) and stoker (import line changed).

A flow in tests/flows/metaflow/ is written as a Metaflow user writes it (`from metaflow import ...`). For stoker
the `from metaflow import` line(s) become `from stoker import` and nothing else changes. Client checks are Python
snippets written the same way: they run in the engine's own interpreter, against the run's own home, and end by
assigning `result`, which comes back as JSON. Every compatibility test compares what both engines produce.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLOWS = Path(__file__).resolve().parents[1] / "flows" / "metaflow"
ENGINES = ("metaflow", "stoker")
_MARK = "@@COMPAT-RESULT@@"


_IMPORTS = (("from metaflow import ", "from stoker import "),
            ("from metaflow.cards import ", "from stoker.cards import "))


def to_stoker(source: str) -> str:
    """The stoker copy of a Metaflow source: `from metaflow import` (and `from metaflow.cards import`) lines
    changed, also where indented (an import in a function, as Metaflow's tutorial 03 has), nothing else."""
    out = []
    for ln in source.splitlines(keepends=True):
        body = ln.lstrip(" \t")
        for mf, st in _IMPORTS:
            if body.startswith(mf):
                ln = ln[:len(ln) - len(body)] + st + body[len(mf):]
                break
        out.append(ln)
    return "".join(out)


@dataclass
class Engine:
    """One engine: its interpreter and how its runs are isolated in `home`."""

    name: str
    python: str

    def source(self, text: str) -> str:
        return text if self.name == "metaflow" else to_stoker(text)

    def env(self, home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("METAFLOW_", "STOKER_HOME", "STOKER_PARAM_", "STOKER_STORE"))}
        env.setdefault("USER", "tester")
        if self.name == "metaflow":
            env.update(METAFLOW_DATASTORE_SYSROOT_LOCAL=str(home), METAFLOW_DEFAULT_DATASTORE="local",
                       METAFLOW_DEFAULT_METADATA="local", METAFLOW_HOME=str(home / "mfhome"))
            env.pop("PYTHONPATH", None)  # stoker's src must not shadow anything in Metaflow's venv
        else:
            env.update(STOKER_HOME=str(home), STOKER_STORE_KEY=os.environ.get("STOKER_STORE_KEY", "test-store-key"))
        env.update(extra or {})
        return env


@dataclass
class FlowRun:
    """One `python flow.py [top] COMMAND ARGS` on one engine; `client(snippet)` reads its results."""

    engine: Engine
    folder: Path
    home: Path
    proc: subprocess.CompletedProcess
    env_extra: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.proc.returncode == 0

    @property
    def output(self) -> str:
        return self.proc.stdout + self.proc.stderr

    def client(self, snippet: str, timeout: float = 120) -> Any:
        """Run a client snippet (written with `from metaflow import ...`) in this engine; returns `result`."""
        code = self.engine.source(textwrap.dedent(snippet)) + \
            f"\nimport json as _j\nprint({_MARK!r} + _j.dumps(result, default=str, sort_keys=True))\n"
        proc = subprocess.run([self.engine.python, "-c", code], cwd=self.folder, capture_output=True, text=True,
                              env=self.engine.env(self.home, self.env_extra), timeout=timeout)
        for line in proc.stdout.splitlines():
            if line.startswith(_MARK):
                return json.loads(line[len(_MARK):])
        raise AssertionError(f"{self.engine.name}: client snippet failed (exit {proc.returncode}):\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def run_flow(engine: Engine, flow: str, folder: Path, *args: str, top: tuple[str, ...] = ("--no-pylint",),
             command: str = "run", env: dict[str, str] | None = None, home: Path | None = None,
             files: dict[str, str] | None = None, timeout: float = 300) -> FlowRun:
    """Copy tests/flows/metaflow/<flow> (and `files`) into `folder` for `engine`, run it as a user would."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / flow).write_text(engine.source((FLOWS / flow).read_text()))
    for name, text in (files or {}).items():  # a name may have folders (a package beside the flow)
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(engine.source(text))
    home = home or folder / "home"
    proc = subprocess.run([engine.python, flow, *top, command, *args], cwd=folder, capture_output=True, text=True,
                          env=engine.env(home, env), timeout=timeout)
    return FlowRun(engine, folder, home, proc, dict(env or {}))


def run_command(engine: Engine, argv: list[str], cwd: Path, home: Path, env: dict[str, str] | None = None,
                timeout: float = 120) -> FlowRun:
    """`engine.python *argv` in `cwd` with the runs in `home`, killed with its whole process group after
    `timeout` s: a hang then fails at once with what it printed (exit 124, as timeout(1) reports), and with the
    Python stacks of the processes that share its stderr (SIGABRT first, with PYTHONFAULTHANDLER set)."""
    proc = subprocess.Popen([engine.python, *argv], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=engine.env(home, {"PYTHONFAULTHANDLER": "1", **(env or {})}),
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        out = err = ""
        for sig, wait in ((signal.SIGABRT, 3), (signal.SIGKILL, 30)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                out, err = proc.communicate(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        code, err = 124, err + f"\n[compat] killed after {timeout:.0f} s: {' '.join(argv)}\n"
    done = subprocess.CompletedProcess([engine.python, *argv], code, out, err)
    return FlowRun(engine, cwd, home, done, dict(env or {}))


def metaflow_tutorials(engine: Engine) -> Path:
    """The `tutorials` folder of the metaflow package that `engine`'s interpreter imports (it ships in the wheel)."""
    out = subprocess.run([engine.python, "-c", "import metaflow, os; print(os.path.dirname(metaflow.__file__))"],
                         capture_output=True, text=True, timeout=60, check=True, env=engine.env(Path("/nonexistent")))
    return Path(out.stdout.strip()) / "tutorials"


def stoker_engine() -> Engine:
    return Engine("stoker", sys.executable)
