"""The examples of Metaflow's documentation in tests/flows/metaflow/docs/ and the command lines the docs give.

Each example is a folder there (the docs' files, verbatim below a header naming the page); `play` copies it for an
engine (import lines changed for stoker), runs the docs' commands in order in one home, then one client snippet.
Every example on both engines runs side by side in a few threads: each run mostly waits on its tasks.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import textwrap
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.compat.engines import ENGINES, FLOWS, Engine, FlowRun, metaflow_tutorials, run_command

DOCS = FLOWS / "docs"
_RUN_ID = re.compile(r"(?:run-id |stoker: run \w+/)(\d+)")


@dataclass(frozen=True)
class Example:
    """One docs example: its folder, the docs' command lines (`{last_run}`: the id of the run last started), the
    environment they add, a client snippet run afterwards (it sets `result`), and set-up the docs ask for."""

    folder: str
    commands: tuple[tuple[str, ...], ...]
    client: str = ""
    env: dict[str, str] = field(default_factory=dict)
    timeout: float = 120
    git: bool = False  # the docs run it "in an existing Git repository"
    helloworld: bool = False  # tutorial 00's helloworld.py beside it (the tagging page's commands use it)


@dataclass
class Played:
    runs: list[FlowRun]
    result: Any

    @property
    def exits(self) -> list[int]:
        return [r.proc.returncode for r in self.runs]

    def output(self, i: int = -1) -> str:
        return self.runs[i].output

    def text(self) -> str:
        return "\n".join(f"--- {' '.join(r.proc.args[1:])} (exit {r.proc.returncode})\n{r.output[-2500:]}"
                         for r in self.runs)


def _setup(engine: Engine, ex: Example, folder: Path, tutorials: Path) -> None:
    shutil.copytree(DOCS / ex.folder, folder, ignore=shutil.ignore_patterns("__pycache__"))
    if ex.helloworld:
        shutil.copy(tutorials / "00-helloworld" / "helloworld.py", folder / "helloworld.py")
    for py in folder.glob("*.py"):
        py.write_text(engine.source(py.read_text()))
    if ex.git:
        env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
               "GIT_COMMITTER_EMAIL": "t@example.com", "PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(folder)}
        for cmd in (["git", "init", "-q", "-b", "main"], ["git", "add", "."], ["git", "commit", "-q", "-m", "docs"]):
            subprocess.run(cmd, cwd=folder, env=env, check=True, capture_output=True, timeout=60)


def play(engine: Engine, ex: Example, folder: Path, tutorials: Path) -> Played:
    _setup(engine, ex, folder, tutorials)
    runs: list[FlowRun] = []
    last = ""
    # Metaflow writes local cards under the working directory's .metaflow and its client reads them under the
    # datastore root: for Metaflow the home is the example's folder, so that both are the same place
    home = folder if engine.name == "metaflow" else folder / "home"
    for argv in ex.commands:
        argv = tuple(a.replace("{last_run}", last) for a in argv)
        runs.append(run_command(engine, list(argv), folder, home, env=ex.env, timeout=ex.timeout))
        last = (_RUN_ID.findall(runs[-1].output) or [last])[-1]
    result: Any = None
    if ex.client:
        try:
            result = runs[-1].client(textwrap.dedent(ex.client))
        except AssertionError as e:
            result = {"client failed": str(e)[-1500:]}
    (folder / "outputs.log").write_text(Played(runs, result).text())
    return Played(runs, result)


def play_all(engines: dict[str, Engine], examples: dict[str, Example], base: Path,
             workers: int = 6) -> dict[str, dict[str, Played]]:
    """{example: {engine: Played}}, every example on every engine, `workers` at a time."""
    jobs = [(key, name) for key in examples for name in ENGINES]
    tutorials = metaflow_tutorials(engines["metaflow"])
    with ThreadPoolExecutor(workers) as pool:
        done = pool.map(lambda j: play(engines[j[1]], examples[j[0]], base / j[1] / j[0], tutorials), jobs)
        got: dict[str, dict[str, Played]] = {}
        for (key, name), p in zip(jobs, done, strict=True):
            got.setdefault(key, {})[name] = p
    return got
